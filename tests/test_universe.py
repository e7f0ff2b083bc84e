"""Universe matching aligns N models to one anchor with function-preserving transforms; the simplex
grid, the multi-model barrier (Eq. 2) and the ternary heatmaps."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from glmc.eval.evaluator import Evaluator
from glmc.eval.simplex import evaluate_simplex, multi_barrier, pairwise_barriers, simplex_points
from glmc.eval.ternary import plot_simplex_heatmaps, to_cartesian
from glmc.interpolation import interpolate
from glmc.matching.engine.circuits import relative_distance
from glmc.matching.universe import relative_change, universe_match
from glmc.matching.weight import WeightMatcher
from glmc.models import to_canonical
from glmc.symmetry import SymmetrySpec, Transform, apply

from families import FAMILIES
from numeric import FORWARD, assert_close_rel
from tiny_hf import inputs_for, tiny_vit

HIDDEN = {"residual": "orthogonal", "heads": "permutation", "mlp": "permutation"}


def images(n=40, seed=0, batch=16):
    g = torch.Generator().manual_seed(seed)
    data = TensorDataset(torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g))
    return DataLoader(data, batch_size=batch)


def tokens(n=12, seed=0, batch=6):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 97, (n, 11), generator=g)
    return DataLoader(TensorDataset(ids, ids), batch_size=batch)


def evaluator_for(family):
    if family == "vit":
        return Evaluator(images(), "classification", progress=False)
    return Evaluator(tokens(), "causal_lm", progress=False)


def _double(model):
    return {k: v.detach().double() for k, v in model.params().items()}


# -- universe matching -----------------------------------------------------------------------


@pytest.mark.numeric
@pytest.mark.parametrize("family", FAMILIES)
def test_hidden_symmetries_are_undone_and_the_simplex_is_flat(family):
    base = to_canonical(FAMILIES[family](seed=0))
    spec = SymmetrySpec.from_model(base)
    models = [base] + [apply(Transform.sample(spec, HIDDEN, torch.Generator().manual_seed(s)), base) for s in (3, 4)]
    assert min(relative_change(m, base) for m in models[1:]) > 0.5  # far apart before matching

    universe = universe_match(models, WeightMatcher(), max_rounds=5)
    assert universe.function_preserving and universe.circuits == ("qk", "vo")
    for aligned in universe.models:
        assert relative_change(aligned, base) < 1e-4
    assert universe.diagnostics["anchor_change"][-1] < 1e-4 and universe.diagnostics["converged"]

    evaluator = evaluator_for(family)
    points = simplex_points(3, step=0.25)
    flat = evaluate_simplex(evaluator, universe.models, points, universe.circuits, progress=False)
    scale = max(flat["endpoint_loss"])
    print(f"\n{family}: aligned simplex barrier {flat['barrier']:.2e} (endpoint loss {scale:.3f})")
    assert abs(flat["barrier"]) < 1e-4 * scale
    assert max(abs(e) for e in flat["excess"]) < 1e-4 * scale
    assert flat["argmax"] in flat["points"] and len(flat["test_loss"]) == len(points) == 15

    # without alignment the merged models are different functions
    raw = evaluate_simplex(evaluator, models, points, (), progress=False)
    assert max(abs(e) for e in raw["excess"]) > 1e-2

    pairs = pairwise_barriers(evaluator, universe.models, universe.circuits, [0.0, 0.5, 1.0])
    assert set(pairs) == {(0, 1), (0, 2), (1, 2)}
    assert all(abs(b) < 1e-4 * scale for b in pairs.values())


@pytest.mark.numeric
@pytest.mark.parametrize("family", FAMILIES)
def test_universe_transforms_preserve_every_models_function(family):
    originals = [FAMILIES[family](seed=s) for s in range(3)]
    models = [to_canonical(m) for m in originals]
    max_rounds = 3
    universe = universe_match(models, WeightMatcher(), max_rounds=max_rounds, tol=1e-6)
    x = inputs_for(originals[0])
    for i, (original, model, transform, aligned) in enumerate(
        zip(originals, models, universe.transforms, universe.models)
    ):
        want = original(x).logits
        assert_close_rel(apply(transform, model)(x), want, FORWARD, f"{family} model {i}: transform applied")
        assert_close_rel(aligned(x), want, FORWARD, f"{family} model {i}: aligned")
        assert aligned.config.form == "factored"

    diag = universe.diagnostics
    print(f"\n{family}: {diag['rounds']} rounds, anchor change {[f'{c:.2e}' for c in diag['anchor_change']]}")
    assert 1 <= diag["rounds"] <= max_rounds and len(diag["anchor_change"]) == diag["rounds"]
    assert diag["anchor_change"][-1] < diag["anchor_change"][0] and diag["seconds"] > 0
    mean = interpolate(universe.models, [1 / 3] * 3)
    assert relative_change(universe.anchor, mean) < 1e-12  # the anchor is the plain mean of the aligned models
    assert sum(p.numel() for p in universe.merge().parameters()) > sum(p.numel() for p in mean.parameters())

    # the common universe brings every pair closer than the unaligned canonical forms
    def mean_distance(ms):
        return np.mean([relative_distance(_double(a), _double(b)) for a, b in itertools.combinations(ms, 2)])

    assert mean_distance(universe.models) < mean_distance(models)


def test_universe_rejects_bad_inputs():
    model = to_canonical(tiny_vit(0))
    with pytest.raises(ValueError, match="two models"):
        universe_match([model], WeightMatcher())
    with pytest.raises(ValueError, match="factored"):
        universe_match([model, model.to_circuit()], WeightMatcher())


# -- simplex and the multi-model barrier ------------------------------------------------------


def test_simplex_points_cover_grid_vertices_and_centroid():
    grid = simplex_points(3, 0.1)
    assert len(grid) == 66 and len(set(grid)) == 66
    assert all(sum(p) == 1.0 and min(p) >= 0 for p in grid)
    assert {(1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0), (0.5, 0.5, 0.0), (0.3, 0.3, 0.4)} <= set(grid)
    assert len(simplex_points(2, 0.25)) == 5

    four = simplex_points(4, samples=10, seed=1)
    assert len(four) == 4 + 6 + 1 + 10
    assert (0.25, 0.25, 0.25, 0.25) in four and (0.5, 0.0, 0.5, 0.0) in four
    assert all(math.isclose(sum(p), 1.0, abs_tol=1e-12) and min(p) >= 0 for p in four)
    assert four == simplex_points(4, samples=10, seed=1) != simplex_points(4, samples=10, seed=2)
    with pytest.raises(ValueError, match="step"):
        simplex_points(3, 0.3)


def test_multi_barrier_is_the_largest_excess_over_the_linear_baseline():
    points = [(1.0, 0.0), (0.0, 1.0), (0.5, 0.5), (0.25, 0.75)]
    value, where = multi_barrier(points, [1.0, 3.0, 2.5, 2.6], [1.0, 3.0])
    assert value == pytest.approx(0.5) and where == (0.5, 0.5)


class QuadraticEvaluator:
    """Loss ||w - c||^2 of a linear layer's weights: convex in the parameters."""

    def __init__(self, centre):
        self.centre, self.calls = centre, 0

    def evaluate(self, model):
        self.calls += 1
        return float((model.weight.detach() - self.centre).pow(2).sum()), 0.0


def test_a_convex_loss_has_no_barrier_over_the_simplex():
    torch.manual_seed(0)
    models = [torch.nn.Linear(5, 3, bias=False) for _ in range(4)]
    evaluator = QuadraticEvaluator(torch.randn(3, 5))
    points = simplex_points(4, samples=20)
    result = evaluate_simplex(evaluator, models, points, progress=False)
    assert evaluator.calls == len(points)  # the vertices give the endpoint losses
    assert result["barrier"] <= 1e-9 and max(result["excess"]) == result["barrier"]
    assert min(result["excess"]) < -1e-3  # strictly below the baseline inside
    want = [float((m.weight.detach() - evaluator.centre).pow(2).sum()) for m in models]
    assert result["endpoint_loss"] == pytest.approx(want)

    inner = [(0.5, 0.5, 0.0, 0.0), (0.25, 0.25, 0.25, 0.25)]
    evaluator.calls = 0
    result = evaluate_simplex(evaluator, models, inner, progress=False)
    assert evaluator.calls == len(inner) + 4 and result["barrier"] < 0
    with pytest.raises(ValueError, match="simplex"):
        evaluate_simplex(evaluator, models, [(0.7, 0.7, -0.4, 0.0)], progress=False)


# -- ternary heatmaps -------------------------------------------------------------------------


def test_ternary_heatmaps_write_a_png(tmp_path):
    points = simplex_points(3, 0.1)
    xy = to_cartesian(points)
    assert np.allclose(xy[points.index((0.0, 0.0, 1.0))], [0.5, math.sqrt(3) / 2])
    bump = np.array([math.prod(p) for p in points])
    panels = {
        name: {"points": points, "test_loss": list(1.0 + scale * bump), "endpoint_loss": [1.0, 1.0, 1.0]}
        for name, scale in (("vanilla", 40.0), ("weight", 5.0), ("learned", -1.0))
    }
    path = plot_simplex_heatmaps(panels, tmp_path / "simplex.png", title="three models", labels=["s0", "s1", "s2"])
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and 20_000 < len(data) < 2_000_000
    with pytest.raises(ValueError, match="three"):
        plot_simplex_heatmaps({"x": {"points": [(0.5, 0.5)], "excess": [0.0]}}, tmp_path / "bad.png")
