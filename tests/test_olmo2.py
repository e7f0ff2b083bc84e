"""OLMo-2 (no pre-norms, a norm after each sublayer, one norm over all heads' queries and one over all keys,
blocks.qk_norm_all): exact conversion, every symmetry its spec claims and the maps its query/key norms remove,
matchers that keep B, an export that reloads, and run.py on two bfloat16 folders."""

import pytest
import torch

from glmc.models import to_canonical
from glmc.models.canonical import CanonicalTransformer, relative_deviation
from glmc.symmetry import Invertible, SemiPermutation, SymmetrySpec, Transform, apply
from glmc.symmetry.embed_width import embed_width

from family_checks import (
    GATED_MLP,
    SANDWICH_STREAM,
    VO,
    alignment_tests,
    assert_export_reloads,
    bfloat16_folders_test,
    symmetry_tests,
)
from numeric import FEW_OPS, assert_close_rel
from tiny_hf import inputs_for, tiny_olmo2

pytestmark = pytest.mark.numeric

KEEPS, CHANGES = 1e-5, 1e-3


@pytest.mark.parametrize("bias", [False, True], ids=["plain", "bias"])
def test_conversion_matches_hf(bias):
    hf = tiny_olmo2(bias=bias)
    model, x = to_canonical(hf), inputs_for(hf)
    with torch.no_grad():
        assert_close_rel(model(x), hf(x).logits, FEW_OPS, "canonical vs HF logits")
    attn = hf.model.layers[0].self_attn
    assert torch.equal(
        model.params()["blocks.0.q_norm"], (attn.scaling * attn.q_norm.weight.double()).float().reshape(2, 2, 8)
    )
    assert torch.equal(model.params()["blocks.1.attn_post"], hf.model.layers[1].post_attention_layernorm.weight)


# Llama's without qk, head copies or an orthogonal stream (blocks/qk_norm_all.py, blocks/sandwich.py say why)
CASES = SANDWICH_STREAM | {("heads", "permutation"), ("qheads", "permutation")} | VO | GATED_MLP


@pytest.fixture(scope="module")
def canonical():
    """The canonical tiny OLMo-2 in float64 (so that 1e-5 is far above rounding), with inputs."""
    hf = tiny_olmo2()
    model = to_canonical(hf)
    return CanonicalTransformer(model.config, {k: v.double() for k, v in model.params().items()}), inputs_for(hf)


test_the_cases_are_what_the_spec_claims, test_symmetry_preserves_function = symmetry_tests(CASES)


def test_a_head_permutation_carries_the_norm_gains(canonical):
    model, _ = canonical
    spec = SymmetrySpec.from_model(model)
    assert {ax.param for ax in spec["heads.0"].acts_on} >= {"blocks.0.q_norm", "blocks.0.k_norm"}
    assert {ax.param for ax in spec["qheads.1"].acts_on} >= {"blocks.1.q_norm"}


def _query_key_map(params: dict, layer: int, a: torch.Tensor) -> dict:
    """q -> A q, k -> A^-T k for each key/value group's (K, dh, dh) map."""
    pre, out = f"blocks.{layer}.", dict(params)
    inv_t = torch.linalg.inv(a).transpose(1, 2)
    out[pre + "q_w"] = torch.einsum("kij,kgjd->kgid", a, params[pre + "q_w"])
    out[pre + "k_w"] = torch.einsum("kij,kjd->kid", inv_t, params[pre + "k_w"])
    return out


def test_the_maps_the_joint_norms_remove_change_logits_and_pair_signs_do_not(canonical):
    model, x = canonical
    params, gen = model.params(), torch.Generator().manual_seed(2)
    groups, dh = params["blocks.1.k_w"].shape[:2]

    def deviation(p) -> float:
        with torch.no_grad():
            return relative_deviation(CanonicalTransformer(model.config, p)(x), model(x))

    invertible = Invertible.sample(groups, dh, gen, torch.float64).matrices
    one_sign = torch.eye(dh, dtype=torch.float64).repeat(groups, 1, 1)
    one_sign[:, 0, 0] = -1.0  # coordinate 0 alone, not its rotary partner dh/2
    pair_signs = one_sign.clone()
    pair_signs[:, dh // 2, dh // 2] = -1.0  # both coordinates of rotary pair 0
    assert deviation(_query_key_map(params, 1, invertible)) > CHANGES
    assert deviation(_query_key_map(params, 1, one_sign)) > CHANGES
    assert deviation(_query_key_map(params, 1, pair_signs)) < KEEPS
    # copying a head adds coordinates to the norm over all heads: not a symmetry here
    copies = Transform({"heads.0": SemiPermutation.sample(groups, groups + 1, gen, torch.float64)})
    with pytest.raises(ValueError, match="semi_permutation is not a symmetry of heads.0"):
        apply(copies, model)
    with torch.no_grad():
        assert relative_deviation(apply(copies, model, strict=False)(x), model(x)) > CHANGES
    # nor are added heads: width embedding refuses them, and widens the rest
    with pytest.raises(ValueError, match="heads=3: qk_norm_all attention normalises all heads' queries together"):
        embed_width(model, model.width, heads=3)
    assert relative_deviation(embed_width(model, model.width, vo_dim=10)(x), model(x)) < KEEPS


pair, test_alignment_keeps_b = alignment_tests(tiny_olmo2)


def test_export_reloads_and_matches(tmp_path):
    hf = tiny_olmo2(bias=True)
    norms = ("post_attention_layernorm", "post_feedforward_layernorm")
    kept = (*(f"model.layers.1.{name}.weight" for name in norms), "model.layers.0.self_attn.q_norm.weight")
    assert_export_reloads(hf, tmp_path, kept=kept)


test_command_line_on_two_bfloat16_folders = bfloat16_folders_test(
    "olmo2",
    {"attention": "qk_norm_all", "mlp": "gated", "head_spaces": ["vo"], "branch": "sandwich"},
    "signed_permutation",
    hidden_act="silu",
    max_positions=16,
)
