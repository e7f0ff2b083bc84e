"""Activation matching (paper 003): keeps B's function, recovers hidden symmetries, two-stage heads."""

from __future__ import annotations

import pytest
import torch

from glmc.matching.activation import ActivationMatcher, CrossMoments, two_stage_heads
from glmc.matching.base import MatchContext
from glmc.models import relative_deviation, to_canonical
from glmc.symmetry import SymmetrySpec, Transform, apply

from families import FAMILIES
from numeric import FEW_OPS, FORWARD, assert_close_rel, assert_params_close_rel
from tiny_hf import inputs_for, tiny_vit

pytestmark = pytest.mark.numeric


def _batches(model, n=3):
    """Training-like batches: random inputs, targets of the right kind (class labels or next tokens)."""
    out = []
    for i in range(n):
        torch.manual_seed(100 + i)
        x = inputs_for(model)
        y = torch.zeros(x.shape[0], dtype=torch.long) if x.dim() == 4 else x.clone()
        out.append((x, y))
    return out


WRITERS = ("embed.", "o_w", "o_b", "out_w", "out_b")


def _max_difference(a, b, names=None):
    pa, pb = a.params(), b.params()
    return max(float((pa[k] - pb[k]).detach().abs().max()) for k in names or pb)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(
    "residual,residual_map",
    [("first", "permutation"), ("last", "permutation"), ("all", "permutation"), ("all", "orthogonal")],
)
def test_aligned_model_computes_b(family, residual, residual_map):
    hf_b = FAMILIES[family](seed=1)
    a, b = to_canonical(FAMILIES[family](seed=0)), to_canonical(hf_b)
    matcher = ActivationMatcher(residual=residual, residual_map=residual_map)
    alignment = matcher.match(a, b, MatchContext(data=_batches(hf_b)))
    x = inputs_for(hf_b)
    assert alignment.function_preserving
    assert_close_rel(alignment.model(x), hf_b(x).logits, FORWARD, f"{family}: aligned B vs B logits")
    # matched units correlate better than units in place
    for before, after in alignment.diagnostics["mean_correlation"].values():
        assert after >= before - 1e-9


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("residual", ["permutation", "orthogonal"])
def test_recovers_a_hidden_symmetry(family, residual):
    a = to_canonical(FAMILIES[family](seed=0))
    spec = SymmetrySpec.from_model(a)
    classes = {"residual": residual, "heads": "permutation", "mlp": "permutation"}
    b = apply(Transform.sample(spec, classes, torch.Generator().manual_seed(5)), a)
    assert _max_difference(a, b) > 0.1
    alignment = ActivationMatcher(residual_map=residual).match(a, b, MatchContext(data=_batches(a.source)))
    # A converted model's stream has zero mean: the ones direction never carries activation, so
    # Procrustes on activations leaves where it goes open; the writers pin everything else.
    names = [k for k in a.params() if any(w in k for w in WRITERS)] if residual == "orthogonal" else list(a.params())
    got, want = alignment.model.params(), a.params()
    assert_params_close_rel({k: got[k] for k in names}, {k: want[k] for k in names}, FEW_OPS, f"{family} {residual}")


def test_two_stage_heads_recover_head_and_inner_permutations():
    heads, dv = 3, 4
    g = torch.Generator().manual_seed(0)
    outer = torch.tensor([2, 0, 1])
    inner = [torch.randperm(dv, generator=g) for _ in range(heads)]
    # B's feature (outer[i], inner[i][e]) is A's feature (i, e); everything else weakly correlated
    corr = 0.1 * torch.rand(heads * dv, heads * dv, generator=g)
    for i in range(heads):
        for e in range(dv):
            corr[i * dv + e, outer[i] * dv + inner[i][e]] = 1.0
    perm, matrices = two_stage_heads(corr, heads)
    assert torch.equal(perm.perm, outer)
    for i in range(heads):
        assert torch.equal(matrices[i].argmax(-1), inner[i])
    # monotonic keeps heads in place
    perm, _ = two_stage_heads(corr, heads, monotonic=True)
    assert torch.equal(perm.perm, torch.arange(heads))


def test_separate_residual_is_flagged_and_exact_only_for_consistent_states():
    a = to_canonical(tiny_vit(seed=0))
    spec = SymmetrySpec.from_model(a)
    b = apply(Transform.sample(spec, {"residual": "permutation"}, torch.Generator().manual_seed(1)), a)
    alignment = ActivationMatcher(residual="separate").match(a, b, MatchContext(data=_batches(a.source)))
    assert not alignment.function_preserving
    # every state of a permuted copy carries the same permutation: separate recovers it exactly
    assert_params_close_rel(alignment.model.params(), a.params(), FEW_OPS, "separate residual, permuted copy")
    other = to_canonical(tiny_vit(seed=1))
    moved = ActivationMatcher(residual="separate").match(a, other, MatchContext(data=_batches(a.source)))
    x = inputs_for(a.source)
    assert relative_deviation(moved.model(x), other(x)) > 1e-3  # not a symmetry for independent models


def test_correlation_of_streamed_batches_matches_the_formula():
    g = torch.Generator().manual_seed(0)
    xa, xb = torch.randn(200, 5, generator=g), torch.randn(200, 6, generator=g)
    m = CrossMoments()
    m.update(xa[:120], xb[:120])
    m.update(xa[120:], xb[120:])
    za = (xa - xa.mean(0)) / xa.std(0, unbiased=False)
    zb = (xb - xb.mean(0)) / xb.std(0, unbiased=False)
    assert_close_rel(m.correlation(), za.T @ zb / 200, FEW_OPS, "streamed correlation")


@pytest.mark.parametrize(
    "options,key",
    [
        ({"residual": "middle"}, "residual"),
        ({"residual_map": "affine"}, "residual_map"),
        ({"heads": "greedy"}, "heads"),
        ({"batches": 0}, "batches"),
        ({"residual": "separate", "residual_map": "orthogonal"}, "residual"),
    ],
)
def test_bad_settings_name_the_key(options, key):
    with pytest.raises(ValueError, match=f"matcher.activation.{key}"):
        ActivationMatcher(**options)


def test_needs_data():
    a, b = to_canonical(tiny_vit(seed=0)), to_canonical(tiny_vit(seed=1))
    with pytest.raises(ValueError, match="data"):
        ActivationMatcher().match(a, b, MatchContext())
