"""Gemma 3's text model (Gemma 2's sandwich norms with a norm on each head's queries and keys, sliding-window
layers with a rotary base of their own): exact conversion on sequences longer than the window, with and
without a scaled global rotary, every symmetry its spec claims, matchers that keep B, an export that reloads,
and run.py on two bfloat16 folders."""

import dataclasses

import pytest
import torch

from glmc.models import to_canonical
from glmc.models.canonical import CanonicalTransformer, relative_deviation
from glmc.models.families.llama import unread_rope_type

from family_checks import (
    GATED_MLP,
    HEADS,
    SANDWICH_STREAM,
    VO,
    alignment_tests,
    assert_export_reloads,
    bfloat16_folders_test,
    canonical_fixture,
    symmetry_tests,
)
from numeric import FEW_OPS, assert_close_rel
from tiny_hf import inputs_for, tiny_gemma3

pytestmark = pytest.mark.numeric

LINEAR = {"rope_type": "linear", "factor": 4.0}


@pytest.mark.parametrize("scaling", [None, LINEAR], ids=["default", "linear"])
def test_conversion_matches_hf(scaling):
    hf = tiny_gemma3(scaling=scaling)
    model, x = to_canonical(hf), inputs_for(hf)
    config = model.config
    assert x.shape[1] > config.sliding_window and config.sliding_layers == [0]
    assert (config.rope_theta, config.rope_local_theta, config.rope_scaling) == (1000.0, 10.0, scaling)
    with torch.no_grad():
        assert_close_rel(model(x), hf(x).logits, FEW_OPS, "canonical vs HF logits")
        # the local layers' own base matters: rotating them with the global one computes something else
        one_base = CanonicalTransformer(dataclasses.replace(config, rope_local_theta=None), model.params())
        assert relative_deviation(one_base(x), hf(x).logits) > 1e-3
    attn = hf.model.layers[0].self_attn
    assert torch.equal(model.params()["blocks.0.k_norm"], 1 + attn.k_norm.weight)


def test_rotary_types_glmc_does_not_read_are_refused_per_layer_type():
    saved = {"rope_parameters": {"full_attention": {"rope_type": "longrope"}, "sliding_attention": {}}}
    assert unread_rope_type(saved) == ("rope_parameters.full_attention.rope_type", "longrope")
    assert unread_rope_type({"rope_parameters": {"full_attention": LINEAR, "sliding_attention": {}}}) is None
    hf = tiny_gemma3(layers=1)
    hf.config.rope_parameters["sliding_attention"] = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10.0}
    with pytest.raises(NotImplementedError, match="rope_parameters.sliding_attention.rope_type='linear'"):
        to_canonical(hf)


# Gemma 2's group without the per-head query/key maps (blocks/qk_norm.py, blocks/sandwich.py say why)
CASES = SANDWICH_STREAM | HEADS | VO | GATED_MLP


canonical = canonical_fixture(tiny_gemma3)
test_the_cases_are_what_the_spec_claims, test_symmetry_preserves_function = symmetry_tests(CASES)


pair, test_alignment_keeps_b = alignment_tests(tiny_gemma3)


def test_export_reloads_and_matches(tmp_path):
    hf = tiny_gemma3(scaling=LINEAR)
    assert_export_reloads(
        hf, tmp_path, kept=("model.layers.1.self_attn.q_norm.weight", "model.layers.1.self_attn.k_norm.weight")
    )


test_command_line_on_two_bfloat16_folders = bfloat16_folders_test(
    "gemma3",
    {"attention": "qk_norm", "mlp": "gated", "head_spaces": ["vo"], "branch": "sandwich"},
    "signed_permutation",
    hidden_act="gelu_pytorch_tanh",
    max_positions=16,
)
