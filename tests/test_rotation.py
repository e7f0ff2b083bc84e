"""Rotation matching (paper 002) keeps B's function, recovers hidden per-head maps, and its closed
form is optimal per head."""

from __future__ import annotations

import pytest
import torch

from glmc.matching.engine.in_head import closed_form_rotations, optimal_scales, pair_objective
from glmc.matching.rotation import RotationMatcher, factored_distance
from glmc.models import to_canonical
from glmc.models.blocks import full
from glmc.models.families.roles import pair_factors
from glmc.symmetry import SymmetrySpec, Transform, apply

from families import FAMILIES
from numeric import FEW_OPS, FORWARD, assert_close_rel, assert_params_close_rel
from tiny_hf import inputs_for, tiny_gpt2, tiny_vit

pytestmark = pytest.mark.numeric


def _double(model):
    return {k: v.detach().double() for k, v in model.params().items()}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("residual", ["none", "orthogonal"])
@pytest.mark.parametrize("rescale", [True, False])
def test_aligned_model_computes_b(family, residual, rescale):
    a, b = to_canonical(FAMILIES[family](seed=0)), FAMILIES[family](seed=1)
    alignment = RotationMatcher(residual=residual, rescale=rescale).match(a, to_canonical(b))
    x = inputs_for(b)
    assert_close_rel(alignment.model(x), b(x).logits, FORWARD, f"{family}: aligned B vs B logits")
    # the combined transform applied to the original B is the aligned model
    again = apply(alignment.transform, to_canonical(b))
    assert_params_close_rel(again.params(), alignment.model.params(), FEW_OPS, "combined transform applied to B")
    assert alignment.circuits == () and alignment.model.config.form == "factored"
    assert alignment.interpolate(0.5).config.form == "factored"


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("heads", ["none", "permutation"])
def test_recovers_hidden_rotations_and_scales(family, heads):
    a = to_canonical(FAMILIES[family](seed=0))
    classes = {"mlp": "permutation", "qk": "orthogonal_scale", "vo": "orthogonal_scale"}
    if heads == "permutation":
        classes["heads"] = "permutation"
    hidden = Transform.sample(SymmetrySpec.from_model(a), classes, torch.Generator().manual_seed(5))
    b = apply(hidden, a)
    assert factored_distance(_double(a), _double(b)) > 0.5
    alignment = RotationMatcher(heads=heads).match(a, b)
    d = alignment.diagnostics
    assert factored_distance(_double(a), _double(alignment.model)) < 1e-4
    assert d["distance_rescaled"] < 1e-4 < d["distance_permutation"]
    # without rescaling the rotations alone cannot undo the hidden scales
    assert RotationMatcher(heads=heads, rescale=False).match(a, b).diagnostics["distance_rescaled"] > 1e-2


def _skew_rotation(d: int, heads: int, eps: float, generator) -> torch.Tensor:
    s = torch.randn(heads, d, d, generator=generator, dtype=torch.float64)
    return torch.linalg.matrix_exp(eps * (s - s.transpose(1, 2)))


@pytest.mark.parametrize("pair", ["qk", "vo"])
def test_closed_form_is_optimal_per_head(pair):
    pa, pb = _double(to_canonical(tiny_vit(seed=0))), _double(to_canonical(tiny_vit(seed=1)))
    g = torch.Generator().manual_seed(0)
    for layer in (0, 1):
        xa, ya = pair_factors(pa, layer, pair, full.ROLES)
        xb, yb = pair_factors(pb, layer, pair, full.ROLES)
        heads, d = xa.shape[:2]
        r = closed_form_rotations(xa, ya, xb, yb)
        assert torch.allclose(r @ r.transpose(1, 2), torch.eye(d, dtype=torch.float64).expand(heads, d, d), atol=1e-10)
        ones = torch.ones(heads, dtype=torch.float64)
        best = pair_objective(xa, ya, xb, yb, r, ones)
        assert (best < pair_objective(xa, ya, xb, yb, torch.eye(d).expand(heads, d, d), ones)).all()
        for eps in (1e-3, 1e-2, 1e-1):
            for _ in range(5):
                moved = pair_objective(xa, ya, xb, yb, r @ _skew_rotation(d, heads, eps, g), ones)
                assert (moved >= best - 1e-9 * best).all()
        # the scale is optimal for the fixed rotation, and the quartic's root beats a = 1
        s = optimal_scales(xa, ya, xb, yb, r)
        scaled = pair_objective(xa, ya, xb, yb, r, s)
        assert (s > 0).all() and (scaled <= best + 1e-12 * best).all()
        for factor in (0.99, 1.01, 0.9, 1.1):
            assert (pair_objective(xa, ya, xb, yb, r, s * factor) >= scaled - 1e-12 * scaled).all()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("residual", ["none", "orthogonal"])
def test_distances_do_not_increase(family, residual):
    a, b = to_canonical(FAMILIES[family](seed=0)), to_canonical(FAMILIES[family](seed=1))
    d = RotationMatcher(residual=residual).match(a, b).diagnostics
    assert d["distance_rescaled"] <= d["distance_rotation"] < d["distance_permutation"]
    assert d["distance_identity"] > 0 and d["seconds"] > 0 and 0 < d["scale_min"] <= d["scale_max"]
    flat = RotationMatcher(residual=residual, rescale=False).match(a, b).diagnostics
    assert flat["distance_rescaled"] == pytest.approx(flat["distance_rotation"])
    assert flat["distance_rotation"] == pytest.approx(d["distance_rotation"])


@pytest.mark.parametrize(
    "key,value",
    [
        ("residual", "rotation"),
        ("heads", "semi_permutation"),
        ("mlp", "orthogonal"),
        ("qk", "factored"),
        ("vo", "invertible"),
        ("vocabulary", "some"),
        ("rescale", "yes"),
        ("max_iter", 0),
    ],
)
def test_bad_arguments_name_the_key(key, value):
    with pytest.raises(ValueError, match=rf"matcher\.rotation\.{key}="):
        RotationMatcher(**{key: value})


def test_requires_factored_models():
    a = to_canonical(tiny_vit(seed=0))
    with pytest.raises(ValueError, match="factored"):
        RotationMatcher().match(a.to_circuit(), a.to_circuit())


def test_in_head_permutations_are_recovered_exactly():
    from glmc.matching.rotation import head_transforms
    from glmc.symmetry import OrthogonalScale, Permutation

    a = to_canonical(tiny_gpt2(seed=0))
    spec = SymmetrySpec.from_model(a)
    g = torch.Generator().manual_seed(7)
    hidden = Transform()
    for name in spec.names("qk") + spec.names("vo"):
        space = spec[name]
        perms = torch.stack([Permutation(torch.randperm(space.size, generator=g)).dense() for _ in range(space.heads)])
        hidden[name] = OrthogonalScale(perms, torch.ones(space.heads))
    b = apply(hidden, a)
    found = head_transforms(_double(a), _double(b), rescale=False, group="permutation")
    for r in (g.rotations for g in found.values()):  # every map is a permutation matrix
        assert torch.equal(r.abs().sum(-1), torch.ones(r.shape[:-1], dtype=r.dtype)) and set(r.unique().tolist()) <= {
            0,
            1,
        }
    back = apply(found.to(dtype=torch.float32), b)
    assert_params_close_rel(back.params(), a.params(), FEW_OPS, "in-head permutations undone")
