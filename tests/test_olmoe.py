"""OLMoE (one RMSNorm over all heads' queries and one over all keys, blocks.qk_norm_all, with a mixture of
SwiGLU experts, blocks.moe): exact conversion with and without renormalised routing, every admitted symmetry
(head permutations only, no query/key maps, the experts' spaces), weight matching that keeps B, an export that
reloads, clipped queries, keys and values refused."""

import pytest
import torch

from glmc.models import to_canonical

from family_checks import (
    EXPERTS,
    STREAM,
    VO,
    alignment_tests,
    assert_export_reloads,
    bfloat16_folders_test,
    canonical_fixture,
    symmetry_tests,
)
from numeric import FEW_OPS, assert_close_rel
from tiny_hf import inputs_for, tiny_olmoe

pytestmark = pytest.mark.numeric


@pytest.mark.parametrize("norm", [False, True], ids=["softmax-weights", "renormalised"])
def test_conversion_matches_hf(norm):
    hf = tiny_olmoe(norm=norm)
    model, x = to_canonical(hf), inputs_for(hf)
    assert model.config.block_settings["experts_renormalise"] == norm
    with torch.no_grad():
        assert_close_rel(model(x), hf(x).logits, FEW_OPS, "canonical vs HF logits")


# OLMo-2's attention spaces (no qk, heads permuted only) with Mixtral's experts
CASES = STREAM | {("heads", "permutation"), ("qheads", "permutation")} | VO | EXPERTS


canonical = canonical_fixture(tiny_olmoe)
test_the_cases_are_what_the_spec_claims, test_symmetry_preserves_function = symmetry_tests(CASES)


# activation and learned: tests/test_mixtral.py's experts
pair, test_alignment_keeps_b_without_query_key_maps = alignment_tests(
    tiny_olmoe, ["weight"], mapped={"heads", "experts"}, unmapped={"qk"}
)


def test_export_reloads_and_matches(tmp_path):
    hf = tiny_olmoe(norm=True)
    assert_export_reloads(hf, tmp_path, kept=("model.layers.1.self_attn.k_norm.weight",))


def test_clipped_queries_keys_and_values_are_refused():
    hf = tiny_olmoe(layers=1)
    hf.config.clip_qkv = 8.0
    with pytest.raises(NotImplementedError, match="clip_qkv=8.0"):
        to_canonical(hf)


test_command_line_on_two_bfloat16_folders = bfloat16_folders_test(
    "olmoe",
    {"attention": "qk_norm_all", "mlp": "moe", "head_spaces": ["vo"]},
    hidden_act="silu",
    max_positions=16,
    num_experts=4,
)
