"""Qwen3 (grouped-query attention with RMSNorms on each head's queries and keys, blocks.qk_norm): exact
conversion with and without sliding windows, matchers that keep B and map no query/key space (weight,
activation, learned), circuit interpolation that leaves the normed queries and keys factored, an export
that reloads, a rotary type refused by name, and run.py on two bfloat16 folders."""

import pytest
import torch

from glmc.interpolation import merge_params
from glmc.models import to_canonical
from glmc.models.canonical import CanonicalTransformer

from family_checks import (
    GATED_MLP,
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
from tiny_hf import inputs_for, tiny_qwen3

pytestmark = pytest.mark.numeric


@pytest.mark.parametrize("settings", [{}, {"window": 4, "full": 1}, {"bias": True}], ids=["full", "window", "bias"])
def test_conversion_matches_hf(settings):
    hf = tiny_qwen3(**settings)
    model, x = to_canonical(hf), inputs_for(hf)
    assert x.shape[1] > (settings.get("window") or 0)  # longer than the window: the mask matters
    assert (model.config.sliding_window, model.config.sliding_layers) == (
        settings.get("window"),
        None if "window" not in settings else [1],
    )
    with torch.no_grad():
        assert_close_rel(model(x), hf(x).logits, FEW_OPS, "canonical vs HF logits")
    scale = hf.model.layers[0].self_attn.scaling
    assert torch.equal(
        model.params()["blocks.0.q_norm"], (scale * hf.model.layers[0].self_attn.q_norm.weight.double()).float()
    )


# Llama's without qk (blocks/qk_norm.py says why; tests/test_qk_norm.py applies the maps it removes)
CASES = STREAM | HEADS | VO | GATED_MLP


canonical = canonical_fixture(tiny_qwen3, window=4, full=1)
test_the_cases_are_what_the_spec_claims, test_symmetry_preserves_function = symmetry_tests(CASES)


pair, test_alignment_keeps_b_without_query_key_maps = alignment_tests(
    tiny_qwen3, mapped={"heads", "qheads", "vo"}, unmapped={"qk"}
)


def test_circuit_interpolation_stacks_values_and_keeps_queries_and_keys_factored(pair):
    hf_a, hf_b, _ = pair
    a, b = to_canonical(hf_a), to_canonical(hf_b)
    merged = merge_params([a.params(), b.params()], [0.5, 0.5], circuits=("qk", "vo"))
    assert merged["blocks.0.q_w"].shape == a.params()["blocks.0.q_w"].shape
    assert merged["blocks.0.v_w"].shape[1] == 2 * a.params()["blocks.0.v_w"].shape[1]
    x = inputs_for(hf_a)
    with torch.no_grad():
        assert torch.isfinite(CanonicalTransformer(a.config, merged)(x)).all()


def test_export_reloads_and_matches(tmp_path):
    hf = tiny_qwen3(window=4, full=1, bias=True)
    assert_export_reloads(hf, tmp_path, kept=("model.layers.1.self_attn.q_norm.weight",))


def test_an_unsupported_rotary_type_is_refused():
    hf = tiny_qwen3(layers=1)
    hf.config.rope_parameters = {"rope_type": "longrope", "rope_theta": 100.0}
    with pytest.raises(NotImplementedError, match="rotary embeddings of type 'longrope'"):
        to_canonical(hf)


test_command_line_on_two_bfloat16_folders = bfloat16_folders_test(
    "qwen3", {"attention": "qk_norm", "mlp": "gated", "head_spaces": ["vo"]}, hidden_act="silu", max_positions=16
)
