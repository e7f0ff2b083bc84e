"""Activation, rotation and learned matching on Llama-style models (grouped-query rotary attention,
SwiGLU): each recovers a hidden symmetry its group contains, every alignment keeps B's function, and
what is not a symmetry there is refused.

Group sizes 1, 2 and 4 are 4 query heads over 4, 2 and 1 key/value heads."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from omegaconf import OmegaConf
from torch.utils.data import DataLoader, TensorDataset

from glmc.config import TrainerConfig
from glmc.eval.evaluator import path_losses
from glmc.matching.activation import ActivationMatcher, grouped_two_stage
from glmc.matching.base import MatchContext
from glmc.matching.learned import LearnedMatcher, carried_along
from glmc.matching.rotation import RotationMatcher
from glmc.matching.weight import used_tokens, weight_matching
from glmc.models import to_canonical
from glmc.symmetry import OrthogonalScale, Permutation, SymmetrySpec, Transform, apply
from glmc.train.latent_fit import fit_latents
from glmc.train.trainer import trainer_factory

from numeric import FORWARD, assert_close_rel, assert_params_close_rel, relative_error
from tiny_hf import tiny_llama

pytestmark = pytest.mark.numeric

GROUPS = {"group1": 4, "group2": 2, "group4": 1}  # key/value heads for 4 query heads


def batches(n=16, seq=12, seed=0, batch_size=8):
    """Next-token batches over random ids (the tiny Llama's vocabulary of 61)."""
    ids = torch.randint(0, 61, (n, seq), generator=torch.Generator().manual_seed(seed))
    return DataLoader(TensorDataset(ids[:, :-1].contiguous(), ids[:, 1:].contiguous()), batch_size=batch_size)


@pytest.fixture(scope="module")
def data():
    return batches()


def llama(kv_heads=2, seed=0):
    return to_canonical(tiny_llama(seed=seed, kv_heads=kv_heads))


def hidden(a, classes, seed=5, vo_permutation=False):
    """A random symmetry of A's classes (space kind -> class); vo_permutation: per group a random
    permutation of the value dims (an orthogonal_scale element of permutation matrices)."""
    spec = SymmetrySpec.from_model(a)
    g = torch.Generator().manual_seed(seed)
    transform = Transform.sample(spec, classes, g)
    if vo_permutation:
        for space in spec.names("vo"):
            groups, dv = spec[space].heads, spec[space].size
            transform[space] = OrthogonalScale(Permutation.sample(dv, g, groups).dense(), torch.ones(groups))
    return transform


def distance(got, want) -> float:
    """||theta - theta_A|| / ||theta_A|| over all parameters."""
    flat = [torch.cat([t.flatten() for t in params.values()]) for params in (got, want)]
    return relative_error(*flat)[0]


def assert_keeps_b(alignment, b, x, what):
    with torch.no_grad():
        for name, aligned in {"main": alignment, **alignment.variants}.items():
            if name == "main" and not alignment.function_preserving:
                continue
            assert_close_rel(aligned.model(x), b(x), FORWARD, f"{what} ({name}): aligned B vs B")


PERMUTATIONS = dict(residual="permutation", heads="permutation", qheads="permutation", mlp="permutation")


# ---------------------------------------------------------------- activation matching


def test_grouped_two_stage_recovers_groups_query_heads_and_value_dims():
    groups, size, dv = 3, 2, 4
    g = torch.Generator().manual_seed(0)
    outer = torch.tensor([2, 0, 1])
    qheads = torch.stack([torch.randperm(size, generator=g) for _ in range(groups)])
    dims = torch.stack([torch.randperm(dv, generator=g) for _ in range(groups)])
    heads = groups * size
    # A's feature (k, q, e) is B's feature (outer[k], qheads[k, q], dims[k, e]); the rest weakly correlated
    corr = 0.1 * torch.rand(heads * dv, heads * dv, generator=g, dtype=torch.float64)
    for k in range(groups):
        for q in range(size):
            for e in range(dv):
                corr[(k * size + q) * dv + e, (outer[k] * size + qheads[k, q]) * dv + dims[k, e]] = 1.0
    got_outer, got_q, matrices, full = grouped_two_stage(corr, groups, size)
    assert torch.equal(got_outer.perm, outer) and torch.equal(got_q.perm, qheads)
    assert torch.equal(matrices.argmax(-1), dims)
    assert float(corr[torch.arange(heads * dv), full].mean()) == 1.0
    kept, kept_q, _, _ = grouped_two_stage(corr, groups, size, monotonic=True)
    assert torch.equal(kept.perm, torch.arange(groups))
    assert torch.equal(kept_q.perm, torch.arange(size).repeat(groups, 1))


@pytest.mark.parametrize("group", GROUPS)
def test_activation_recovers_hidden_permutations_and_unit_scales(group, data):
    """Key/value groups, query heads within them, value dims per group, the stream and MLP units
    permuted, the up branch scaled (with signs): activation matching finds all of it."""
    a = llama(GROUPS[group])
    b = apply(hidden(a, {**PERMUTATIONS, "mlp_scale": "diagonal"}, vo_permutation=True), a)
    assert distance(b.params(), a.params()) > 0.5
    alignment = ActivationMatcher(residual="all", batches=2).match(a, b, MatchContext(data=data))
    assert alignment.function_preserving
    assert_params_close_rel(alignment.model.params(), a.params(), FORWARD, f"activation {group}: recovered A")


CASES = {
    "all, two-stage": dict(residual="all"),
    "identity, monotonic": dict(residual="identity", heads="monotonic"),
    "last, no heads": dict(residual="last", heads="none"),
    "orthogonal residual": dict(residual="all", residual_map="orthogonal"),
}


@pytest.mark.parametrize("case", CASES)
def test_activation_on_independent_llamas_keeps_b(case, data):
    a, b = llama(seed=0), llama(seed=1)
    alignment = ActivationMatcher(batches=2, **CASES[case]).match(a, b, MatchContext(data=data))
    assert alignment.function_preserving and alignment.transform is not None
    assert_keeps_b(alignment, b, next(iter(data))[0], f"activation {case}")
    if CASES[case].get("heads", "two_stage") == "two_stage":
        assert {"heads.0", "qheads.0", "vo.0", "mlp.0", "mlp_scale.0"} <= set(alignment.transform)
    assert "qk.0" not in alignment.transform  # rotary query/key spaces take no permutation
    for before, after in alignment.diagnostics["mean_correlation"].values():
        assert after >= before - 1e-9


def test_activation_refuses_what_is_not_a_symmetry_of_llama(data):
    a, b = llama(seed=0), llama(seed=1)
    with pytest.raises(ValueError, match="heads=ignore.*grouped-query"):
        ActivationMatcher(heads="ignore").match(a, b, MatchContext(data=data))


# ---------------------------------------------------------------- rotation matching

ROTARY = dict(qk="rotary_scale", vo="orthogonal_scale", mlp="permutation", mlp_scale="diagonal")


@pytest.mark.parametrize("group", GROUPS)
def test_rotation_recovers_hidden_rotary_and_value_maps(group, data):
    """Rotary rotation-scalings per frequency pair, value rotations with scales, MLP permutation and
    up/down scales, the stream and heads in place (paper 002's setting): recovered in closed form."""
    a = llama(GROUPS[group])
    b = apply(hidden(a, ROTARY), a)
    alignment = RotationMatcher().match(a, b)
    d = alignment.diagnostics
    assert d["distance_identity"] > 0.5 and d["distance_rescaled"] < 1e-5, d
    assert d["distance_rescaled"] < d["distance_rotation"] < d["distance_permutation"] < d["distance_identity"]
    assert_params_close_rel(alignment.model.params(), a.params(), FORWARD, f"rotation {group}: recovered A")
    assert_keeps_b(alignment, b, next(iter(data))[0], f"rotation {group}")


def test_rotation_with_residual_and_heads_recovers_every_llama_symmetry(data):
    a = llama(2)
    b = apply(hidden(a, {**ROTARY, "residual": "orthogonal", "heads": "permutation", "qheads": "permutation"}), a)
    alignment = RotationMatcher(residual="orthogonal", heads="permutation").match(a, b)
    assert_params_close_rel(alignment.model.params(), a.params(), FORWARD, "rotation + residual + heads")
    assert_keeps_b(alignment, b, next(iter(data))[0], "rotation + residual + heads")


def test_rotation_on_independent_llamas_and_its_in_head_permutation_variant(data):
    """Every variant keeps B's function; the in-head permutation variant moves value dims only: a rotary
    query/key space admits no permutation, so q and k stay as the unit permutations left them."""
    a, b = llama(seed=0), llama(seed=1)
    alignment = RotationMatcher(heads="permutation").match(a, b)
    assert set(alignment.variants) == {"permutation_only", "head_permutation", "no_rescale"}
    assert_keeps_b(alignment, b, next(iter(data))[0], "rotation on independent llamas")
    d = alignment.diagnostics
    assert d["distance_rescaled"] <= d["distance_rotation"] + 1e-9 < d["distance_permutation"]
    units = alignment.variants["permutation_only"].model.params()
    permuted = alignment.variants["head_permutation"].model.params()
    for name in ("blocks.0.q_w", "blocks.0.k_w"):
        assert torch.equal(permuted[name], units[name])
    assert not torch.equal(permuted["blocks.0.v_w"], units["blocks.0.v_w"])


# ---------------------------------------------------------------- learned matching


def context(data, tmp_path):
    trainer = trainer_factory(OmegaConf.structured(TrainerConfig(accelerator="cpu", enable_progress_bar=False)))
    return MatchContext(data=data, trainer=trainer, run_dir=tmp_path, fit=fit_latents, path_loss=path_losses)


def test_carried_elements_follow_the_learned_permutations():
    """Weight matching's per-group and per-unit elements, applied to B in B's own order, then any key/value
    group and MLP permutation: the same model as the composed transform applied to B."""
    a, b = llama(seed=0), llama(seed=1)
    start, _ = weight_matching(a, b, max_iter=2)
    fixed = carried_along(start, start, inverse=True)
    assert set(fixed) == {n for n in start if n.split(".")[0] in ("qheads", "qk", "vo", "mlp_scale")}
    learned = Transform({n: g for n, g in start.items() if n not in fixed})
    assert_params_close_rel(apply(learned, apply(fixed, b)).params(), apply(start, b).params(), FORWARD, "start")
    spec, g = SymmetrySpec.from_model(b), torch.Generator().manual_seed(3)
    other = Transform.sample(spec, {"heads": "permutation", "mlp": "permutation"}, g)
    composed = Transform({**other, **carried_along(fixed, other)})
    assert_params_close_rel(apply(composed, b).params(), apply(other, apply(fixed, b)).params(), FORWARD, "other")


@pytest.mark.parametrize("units", ["permutation", "sinkhorn"])
def test_learned_on_llama_keeps_b_and_is_no_worse_than_weight_matching(units, data, tmp_path):
    a, b = llama(seed=0), llama(seed=1)
    matcher = LearnedMatcher(units=units, qk="none", vo="none", max_steps=2, lr=1e-2, weight_max_iter=3)
    ctx = context(data, tmp_path)
    alignment = matcher.match(a, b, ctx)
    x = next(iter(data))[0]
    assert {"residual", "heads.0", "qheads.0", "qk.0", "vo.0", "mlp.0", "mlp_scale.0"} <= set(alignment.transform)
    assert_close_rel(apply(alignment.transform, b)(x), b(x), FORWARD, f"learned {units}: its transform keeps B")
    assert_keeps_b(alignment, b, x, f"learned {units}")
    if units == "sinkhorn":  # the soft path it trained, with the hard projection beside it
        assert not alignment.function_preserving and "hard_projection" in alignment.variants
        assert alignment.diagnostics["endpoint_deviation"] > 1e-3
        return
    start, _ = weight_matching(a, b, max_iter=3, tokens=used_tokens(b, ctx))  # the learned run's start
    paths = {
        "weight": dataclasses.replace(alignment, model=apply(start, b), transform=start, diagnostics={}),
        "learned": alignment,
    }
    losses = path_losses(paths, (0.25, 0.5, 0.75), list(data), "causal_lm", torch.device("cpu"))
    assert max(losses["learned"]) <= max(losses["weight"]) + 1e-6, losses
