"""Qwen3-MoE (RMSNorms on each head's queries and keys, blocks.qk_norm, with a mixture of SwiGLU experts,
blocks.moe): exact conversion with and without renormalised routing under a sliding window, every admitted
symmetry (no query/key maps, the experts' spaces), weight matching that keeps B, an export that reloads,
dense layers refused."""

import pytest
import torch

from glmc.models import to_canonical

from family_checks import (
    EXPERTS,
    HEADS,
    STREAM,
    VO,
    alignment_tests,
    assert_export_reloads,
    bfloat16_folders_test,
    canonical_fixture,
    symmetry_tests,
)
from numeric import FEW_OPS, assert_close_rel
from tiny_hf import inputs_for, tiny_qwen3_moe

pytestmark = pytest.mark.numeric


@pytest.mark.parametrize("norm", [False, True], ids=["softmax-weights", "renormalised"])
def test_conversion_matches_hf(norm):
    hf = tiny_qwen3_moe(norm=norm)
    model, x = to_canonical(hf), inputs_for(hf)
    settings = model.config.block_settings
    assert (settings["experts_renormalise"], model.config.sliding_window) == (norm, 4) and x.shape[1] > 4
    with torch.no_grad():
        assert_close_rel(model(x), hf(x).logits, FEW_OPS, "canonical vs HF logits")


# Qwen3's attention spaces (no qk) with Mixtral's experts
CASES = STREAM | HEADS | VO | EXPERTS


canonical = canonical_fixture(tiny_qwen3_moe)
test_the_cases_are_what_the_spec_claims, test_symmetry_preserves_function = symmetry_tests(CASES)


# activation and learned: tests/test_mixtral.py's experts
pair, test_alignment_keeps_b_without_query_key_maps = alignment_tests(
    tiny_qwen3_moe, ["weight"], mapped={"heads", "experts"}, unmapped={"qk"}
)


def test_export_reloads_and_matches(tmp_path):
    hf = tiny_qwen3_moe(norm=False)
    assert_export_reloads(hf, tmp_path, kept=("model.layers.1.self_attn.k_norm.weight",))


def test_dense_mlp_layers_are_refused():
    hf = tiny_qwen3_moe(layers=1)
    hf.config.decoder_sparse_step = 2
    with pytest.raises(NotImplementedError, match="decoder_sparse_step=2"):
        to_canonical(hf)


test_command_line_on_two_bfloat16_folders = bfloat16_folders_test(
    "qwen3_moe",
    {"attention": "qk_norm", "mlp": "moe", "head_spaces": ["vo"]},
    hidden_act="silu",
    max_positions=16,
    num_experts=4,
)
