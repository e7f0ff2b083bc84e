"""Qwen2-MoE (Qwen2's attention, a mixture of SwiGLU experts and a gated shared expert: blocks.moe_shared):
exact conversion with and without renormalised routing, every admitted symmetry (the shared expert's units
and scales beside the experts'), weight matching that keeps B, an export that reloads, dense layers refused."""

import pytest
import torch

from glmc.models import to_canonical

from family_checks import (
    EXPERTS,
    GATED_MLP,
    HEADS,
    ROTARY_QK,
    STREAM,
    VO,
    alignment_tests,
    assert_export_reloads,
    bfloat16_folders_test,
    canonical_fixture,
    symmetry_tests,
)
from numeric import FEW_OPS, assert_close_rel
from tiny_hf import inputs_for, tiny_qwen2_moe

pytestmark = pytest.mark.numeric


@pytest.mark.parametrize("norm", [False, True], ids=["softmax-weights", "renormalised"])
def test_conversion_matches_hf(norm):
    hf = tiny_qwen2_moe(norm=norm)
    model, x = to_canonical(hf), inputs_for(hf)
    assert (model.config.block_settings["experts_renormalise"], model.config.sliding_layers) == (norm, [0])
    with torch.no_grad():
        assert_close_rel(model(x), hf(x).logits, FEW_OPS, "canonical vs HF logits")


# Mixtral's (tests/test_mixtral.py), with the shared expert's gated units and their up/down scale
CASES = STREAM | HEADS | ROTARY_QK | VO | EXPERTS | GATED_MLP


canonical = canonical_fixture(tiny_qwen2_moe)
test_the_cases_are_what_the_spec_claims, test_symmetry_preserves_function = symmetry_tests(CASES)


# activation and learned: tests/test_mixtral.py's experts
pair, test_alignment_keeps_b = alignment_tests(tiny_qwen2_moe, ["weight"], mapped={"heads", "mlp", "experts"})


def test_export_reloads_and_matches(tmp_path):
    hf = tiny_qwen2_moe(norm=True)
    # no norm gain folds into the shared expert's down projection
    assert_export_reloads(hf, tmp_path, kept=("model.layers.1.mlp.shared_expert.down_proj.weight",))


def test_dense_mlp_layers_are_refused():
    hf = tiny_qwen2_moe(layers=1)
    hf.config.mlp_only_layers = [0]
    with pytest.raises(NotImplementedError, match="mlp_only_layers=\\[0\\]"):
        to_canonical(hf)


test_command_line_on_two_bfloat16_folders = bfloat16_folders_test(
    "qwen2_moe",
    {"attention": "grouped", "mlp": "moe_shared", "head_spaces": ["qk", "vo"]},
    hidden_act="silu",
    max_positions=16,
    num_experts=4,
)
