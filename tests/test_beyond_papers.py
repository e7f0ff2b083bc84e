"""weight_refined and learned_dual (glmc.matching.weight_refined, glmc.matching.learned_dual): both keep
the endpoints' functions; weight_refined's objective is never worse than weight matching's, and
learned_dual's path runs between A's and B's own losses."""

from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf
from torch.utils.data import DataLoader, TensorDataset

from glmc import align
from glmc.eval.barrier import barrier
from glmc.eval.evaluator import evaluate, evaluate_path
from glmc.matching.engine.circuits import relative_distance
from glmc.matching.registry import _MethodDefaults, default_target
from glmc.matching.weight import weight_matching
from glmc.matching.weight_refined import WeightRefinedMatcher
from glmc.models import to_canonical
from glmc.symmetry import Orthogonal, Permutation

from families import FAMILIES
from numeric import FORWARD, assert_close_rel
from tiny_hf import inputs_for, tiny_vit

TINY = dict(hidden=16, heads=2, mlp=32)
QUICK = dict(starts=1, rounds=2, steps=4)  # every kind of start and move, few of them


def _double(model):
    return {k: v.detach().double() for k, v in model.params().items()}


@pytest.mark.parametrize("family,proxy", zip(FAMILIES, ("gain", "stream")))  # each proxy on one family
def test_weight_refined_keeps_b_and_never_loses_to_weight_matching(family, proxy):
    hf_a, hf_b = FAMILIES[family](seed=0, **TINY), FAMILIES[family](seed=1, **TINY)
    a, b = to_canonical(hf_a), to_canonical(hf_b)
    alignment = WeightRefinedMatcher(proxy=proxy, proxy_weight=1.0, **QUICK).match(a, b)
    x = inputs_for(hf_b)
    assert_close_rel(alignment.model(x), hf_b(x).logits, FORWARD, f"{family}: weight_refined B vs B logits")
    assert {type(g) for g in alignment.transform.values()} == {Orthogonal, Permutation}
    d = alignment.diagnostics
    assert d["refined"] and set(d["starts"]) == {"weight", "weight_perm", "random_0"}
    assert d["final"]["objective"] <= d["start_objective"]["objective"] + 1e-12
    assert d["starts"][d["chosen_start"]] == min(d["starts"].values()) == pytest.approx(d["final"]["objective"])
    # the objective's distance is weight matching's own, at its solution and at the returned transform
    assert d["start_objective"]["distance"] == pytest.approx(d["weight_matching"]["final_distance"], rel=1e-5)
    refined = relative_distance(_double(a), _double(alignment.model))
    assert d["final"]["distance"] == pytest.approx(refined, rel=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_weight_refined_without_the_proxy_lowers_the_weight_space_distance(family):
    a, b = (to_canonical(FAMILIES[family](seed=s, **TINY)) for s in (0, 1))
    alignment = WeightRefinedMatcher(proxy_weight=0.0, starts=0, rounds=1, steps=4).match(a, b)
    wm = weight_matching(a, b)[1]["final_distance"]
    assert relative_distance(_double(a), _double(alignment.model)) <= wm * (1 + 1e-6)


def test_weight_refined_returns_weight_matching_where_it_cannot_refine():
    a, b = (to_canonical(tiny_vit(seed=s, **TINY)) for s in (0, 1))
    alignment = WeightRefinedMatcher(residual="permutation").match(a, b)
    assert not alignment.diagnostics["refined"] and "permutation" in alignment.diagnostics["reason"]
    expected = weight_matching(a, b, "permutation")[0]
    assert all(torch.equal(g.perm, expected[n].perm) for n, g in alignment.transform.items())


def test_learned_dual_keeps_both_endpoints_and_its_path_ends_at_their_losses(tmp_path):
    hf_a, hf_b = (tiny_vit(seed=s, **TINY) for s in (0, 1))
    g = torch.Generator().manual_seed(0)
    data = DataLoader(
        TensorDataset(torch.randn(64, 1, 8, 8, generator=g), torch.randint(0, 10, (64,), generator=g)), batch_size=32
    )
    options = dict(data=data, trainer={"accelerator": "cpu", "enable_progress_bar": False}, max_steps=4, lr=0.05)
    dual = align(hf_a, hf_b, matcher="learned_dual", run_dir=tmp_path / "dual", **options)
    x = next(iter(data))[0]
    assert_close_rel(dual.model(x), hf_b(x).logits, FORWARD, "learned_dual: T_B(B) vs B logits")
    assert_close_rel(dual.reference(x), hf_a(x).logits, FORWARD, "learned_dual: T_A(A) vs A logits")
    d = dual.diagnostics
    assert dual.function_preserving and d["steps"] == 4 and d["reference_deviation"] < 1e-4
    assert d["changed_from_init"]["residual"] > 0 and len(d["reference_angles"]) == 16  # both sides trained
    lambdas = [0.0, 0.5, 1.0]
    path = evaluate_path(dual, None, data, lambdas, progress=False)["loss"]
    loss_a, loss_b = evaluate(hf_a, data)[0], evaluate(hf_b, data)[0]
    assert path[-1] == pytest.approx(loss_a, rel=1e-4) and path[0] == pytest.approx(loss_b, rel=1e-4)
    assert math.isfinite(barrier(lambdas, path))


def test_learned_dual_trains_for_learned_matchings_steps():
    root = OmegaConf.structured(_MethodDefaults)
    root.matcher.learned.max_steps, root.matcher.learned.lr = 7, 0.02
    node = OmegaConf.to_container(root.matcher.learned_dual, resolve=True)
    assert (node["max_steps"], node["lr"], node["_target_"]) == (7, 0.02, default_target("learned_dual"))


def test_learned_dual_refuses_soft_permutations():
    with pytest.raises(ValueError, match="matcher.learned_dual.units=sinkhorn"):
        align(*(tiny_vit(seed=s, **TINY) for s in (0, 1)), matcher="learned_dual", units="sinkhorn")
