"""Gemma 2 (sandwich norms, soft-capped attention scores and logits, alternating sliding-window and global
layers, a query scale of its own): exact conversion on sequences longer than the window, every symmetry its
spec claims, matchers that keep B, an export that reloads, and run.py on two bfloat16 folders."""

import dataclasses

import pytest
import torch

from glmc.models import to_canonical
from glmc.models.canonical import CanonicalTransformer, relative_deviation
from glmc.models.export import export_hf

from family_checks import (
    GATED_MLP,
    HEADS,
    ROTARY_QK,
    SANDWICH_STREAM,
    VO,
    alignment_tests,
    assert_export_reloads,
    bfloat16_folders_test,
    canonical_fixture,
    symmetry_tests,
)
from numeric import FEW_OPS, assert_close_rel
from tiny_hf import inputs_for, tiny_gemma2

pytestmark = pytest.mark.numeric


@pytest.mark.parametrize("bias", [False, True], ids=["plain", "bias"])
def test_conversion_matches_hf(bias):
    hf = tiny_gemma2(bias=bias)
    model, x = to_canonical(hf), inputs_for(hf)
    assert x.shape[1] > hf.config.sliding_window  # longer than the window: the mask matters
    config = model.config
    assert (config.sliding_window, config.sliding_layers) == (4, [0])
    assert (config.attn_softcap, config.logit_softcap) == (4.0, 5.0)
    with torch.no_grad():
        assert_close_rel(model(x), hf(x).logits, FEW_OPS, "canonical vs HF logits")
        post = 1 + hf.model.layers[1].post_feedforward_layernorm.weight
        assert torch.equal(model.params()["blocks.1.mlp_post"], post)
        # each cap bends the logits: without it the model computes something else
        for cap in ("attn_softcap", "logit_softcap"):
            uncapped = CanonicalTransformer(dataclasses.replace(config, **{cap: None}), model.params())
            assert relative_deviation(uncapped(x), hf(x).logits) > 1e-3, cap


# Gemma's group with the residual stream narrowed to permutations (blocks/sandwich.py says why)
CASES = SANDWICH_STREAM | HEADS | ROTARY_QK | VO | GATED_MLP


canonical = canonical_fixture(tiny_gemma2)
test_the_cases_are_what_the_spec_claims, test_symmetry_preserves_function = symmetry_tests(CASES)


pair, test_alignment_keeps_b = alignment_tests(tiny_gemma2)


def test_export_reloads_and_matches(tmp_path):
    hf = tiny_gemma2(bias=True)
    norms = ("post_attention_layernorm", "post_feedforward_layernorm")
    assert_export_reloads(hf, tmp_path, kept=tuple(f"model.layers.1.{name}.weight" for name in norms))


def test_an_export_to_a_template_with_other_caps_is_refused(tmp_path):
    hf = tiny_gemma2(layers=1)
    template = tiny_gemma2(layers=1)
    template.config.final_logit_softcapping = 30.0
    with pytest.raises(ValueError, match="soft caps"):
        export_hf(to_canonical(hf), template, tmp_path / "out")


test_command_line_on_two_bfloat16_folders = bfloat16_folders_test(
    "gemma2",
    {"attention": "grouped", "mlp": "gated", "head_spaces": ["qk", "vo"], "branch": "sandwich"},
    "signed_permutation",
    hidden_act="gelu_pytorch_tanh",
    max_positions=16,
)
