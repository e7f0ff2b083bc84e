"""The query/key-norm block (glmc.models.blocks.qk_norm, Qwen3): every element of the group its roles
declare keeps the logits; the per-head query/key maps it removes (invertible, and grouped rotary
attention's rotation-scalings) and a sign flip of one coordinate change them, a sign flip of whole rotary
pairs of a group's queries and keys does not; its group has no qk space."""

import dataclasses

import pytest
import torch

from glmc.models import to_canonical
from glmc.models.blocks import BlockKind, block_kind, grouped
from glmc.models.canonical import CanonicalTransformer, relative_deviation
from glmc.symmetry import Invertible, SymmetrySpec, Transform, apply

from family_checks import STREAM, claimed
from tiny_hf import inputs_for, tiny_qwen3

pytestmark = pytest.mark.numeric

KEEPS, CHANGES = 1e-5, 1e-3


@pytest.fixture(scope="module")
def qwen3():
    """The canonical tiny Qwen3 in float64 (so that 1e-5 is far above rounding), with inputs."""
    hf = tiny_qwen3(window=4, full=1)
    model = to_canonical(hf)
    model = CanonicalTransformer(model.config, {k: v.double() for k, v in model.params().items()})
    return model, inputs_for(hf)


def with_query_key_map(params: dict, layer: int, a: torch.Tensor) -> dict:
    """q -> A q and k -> A^-T k for each key/value group's (K, dh, dh) map `a`, on weights and biases."""
    pre, out = f"blocks.{layer}.", dict(params)
    inv_t = torch.linalg.inv(a).transpose(1, 2)
    out[pre + "q_w"] = torch.einsum("kij,kgjd->kgid", a, params[pre + "q_w"])
    out[pre + "q_b"] = torch.einsum("kij,kgj->kgi", a, params[pre + "q_b"])
    out[pre + "k_w"] = torch.einsum("kij,kjd->kid", inv_t, params[pre + "k_w"])
    out[pre + "k_b"] = torch.einsum("kij,kj->ki", inv_t, params[pre + "k_b"])
    return out


def deviation(model, x, params) -> float:
    with torch.no_grad():
        return relative_deviation(CanonicalTransformer(model.config, params)(x), model(x))


@pytest.mark.parametrize("kind,group", sorted({("residual", "orthogonal"), ("residual", "permutation")}))
def test_the_residual_classes_keep_logits(qwen3, kind, group):
    model, x = qwen3
    transform = Transform.sample(SymmetrySpec.from_model(model), {kind: group}, torch.Generator().manual_seed(0))
    assert deviation(model, x, apply(transform, model).params()) < KEEPS


def test_every_admitted_per_layer_element_keeps_logits(qwen3):
    model, x = qwen3
    cases = dict(claimed(model) - STREAM - {("vo", "invertible")})
    assert set(cases) == {"heads", "qheads", "vo", "mlp", "mlp_scale"}
    for classes in (cases, {"heads": "semi_permutation", "vo": "invertible"}):
        grow = 2 if "semi_permutation" in classes.values() else 0
        gen = torch.Generator().manual_seed(1)
        transform = Transform.sample(SymmetrySpec.from_model(model), classes, gen, grow=grow, dtype=torch.float64)
        new = apply(transform, model)
        assert any(not torch.equal(new.params()[k], v) for k, v in model.params().items() if "q_w" in k)
        assert deviation(model, x, new.params()) < KEEPS, classes


def _pair_map(dh: int, groups: int, real: torch.Tensor, imag: torch.Tensor) -> torch.Tensor:
    """(K, dh, dh): per group and rotary pair (i, i + dh/2) the rotation-scaling [[a, -b], [b, a]]."""
    half, a = dh // 2, torch.zeros(groups, dh, dh, dtype=torch.float64)
    i = torch.arange(half)
    a[:, i, i], a[:, i + half, i + half] = real, real
    a[:, i, i + half], a[:, i + half, i] = -imag, imag
    return a


def test_per_pair_sign_flips_of_a_groups_queries_and_keys_keep_logits(qwen3):
    model, x = qwen3
    groups, dh = model.params()["blocks.0.k_w"].shape[:2]
    signs = torch.tensor([[-1.0, 1.0, -1.0, -1.0], [1.0, -1.0, 1.0, -1.0]], dtype=torch.float64)[:groups, : dh // 2]
    flip = _pair_map(dh, groups, signs, torch.zeros_like(signs))
    assert deviation(model, x, with_query_key_map(model.params(), 0, flip)) < KEEPS


def test_removed_query_key_maps_change_logits(qwen3):
    model, x = qwen3
    params, gen = model.params(), torch.Generator().manual_seed(2)
    groups, dh = params["blocks.1.k_w"].shape[:2]
    invertible = Invertible.sample(groups, dh, gen, torch.float64).matrices
    real, imag = (torch.rand(groups, dh // 2, generator=gen, dtype=torch.float64) + 0.5 for _ in range(2))
    rotation_scaling = _pair_map(dh, groups, real, imag)
    one_sign = torch.eye(dh, dtype=torch.float64).repeat(groups, 1, 1)
    one_sign[:, 0, 0] = -1.0  # coordinate 0 alone, not its rotary partner dh/2
    for what, a in (("invertible", invertible), ("rotation-scaling", rotation_scaling), ("one sign", one_sign)):
        assert deviation(model, x, with_query_key_map(params, 1, a)) > CHANGES, what
    # without the norms the rotation-scaling is a symmetry of grouped rotary attention: the norm removes it
    plain = {k: v for k, v in with_query_key_map(params, 1, rotation_scaling).items() if "_norm" not in k}
    twin = CanonicalTransformer(dataclasses.replace(model.config, family="llama"), plain)
    reference = CanonicalTransformer(twin.config, {k: v for k, v in params.items() if "_norm" not in k})
    with torch.no_grad():
        assert relative_deviation(twin(x), reference(x)) < KEEPS


def test_the_group_has_no_qk_space_and_refuses_a_qk_element(qwen3):
    model, _ = qwen3
    spec = SymmetrySpec.from_model(model)
    assert not spec.names("qk") and spec.names("vo") == ["vo.0", "vo.1"]
    groups, dh = model.params()["blocks.0.k_w"].shape[:2]
    with pytest.raises((KeyError, ValueError), match="qk.0"):
        apply(Transform({"qk.0": Invertible.sample(groups, dh)}), model)


def test_a_kind_declares_exactly_the_head_spaces_of_its_roles():
    kind = block_kind("qk_norm")
    assert kind.head_spaces == {"vo"} and kind.grouped and not kind.circuit
    with pytest.raises(ValueError, match="declares head spaces \\['vo'\\] but its roles act on \\['qk', 'vo'\\]"):
        BlockKind("wrong", "attention", kind.forward, grouped.ROLES, head_spaces=frozenset({"vo"}))
