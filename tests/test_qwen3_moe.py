"""Qwen3-MoE (RMSNorms on each head's queries and keys, blocks.qk_norm, with a mixture of SwiGLU experts,
blocks.moe): exact conversion with and without renormalised routing under a sliding window, every admitted
symmetry (no query/key maps, the experts' spaces), weight matching that keeps B, an export that reloads,
dense layers refused."""

import pytest
import torch

import glmc
from glmc.models import to_canonical
from glmc.models.export import export_hf

from family_checks import MATCHERS, assert_symmetry_keeps_function, claimed, next_token_data
from numeric import FEW_OPS, FORWARD, assert_close_rel
from tiny_hf import inputs_for, tiny_qwen3_moe

pytestmark = pytest.mark.numeric


@pytest.mark.parametrize("norm", [False, True], ids=["softmax-weights", "renormalised"])
def test_conversion_matches_hf(norm):
    hf = tiny_qwen3_moe(norm=norm)
    model, x = to_canonical(hf), inputs_for(hf)
    assert (model.config.experts_renormalise, model.config.sliding_window) == (norm, 4) and x.shape[1] > 4
    with torch.no_grad():
        assert_close_rel(model(x), hf(x).logits, FEW_OPS, "canonical vs HF logits")


# Qwen3's attention spaces (no qk) with Mixtral's experts
CASES = {
    ("residual", "orthogonal"),
    ("residual", "permutation"),
    ("heads", "permutation"),
    ("heads", "semi_permutation"),
    ("qheads", "permutation"),
    ("vo", "invertible"),
    ("vo", "orthogonal_scale"),
    ("experts", "permutation"),
    ("expert_units", "permutation"),
}


@pytest.fixture(scope="module")
def qwen3_moe():
    hf = tiny_qwen3_moe()
    return to_canonical(hf), inputs_for(hf)


def test_the_cases_are_what_the_spec_claims(qwen3_moe):
    assert claimed(qwen3_moe[0]) == CASES


@pytest.mark.parametrize("kind,group", sorted(CASES))
def test_symmetry_preserves_function(qwen3_moe, kind, group):
    model, x = qwen3_moe
    assert_symmetry_keeps_function(model, x, {kind: group}, f"{kind} {group}")


@pytest.mark.parametrize("method", ["weight"])  # activation and learned: tests/test_mixtral.py's experts
def test_alignment_keeps_b_without_query_key_maps(method, tmp_path):
    hf_a, hf_b, data = tiny_qwen3_moe(seed=0), tiny_qwen3_moe(seed=1), next_token_data(61)
    trainer = {"accelerator": "cpu", "enable_progress_bar": False}
    alignment = glmc.align(hf_a, hf_b, method, data=data, run_dir=tmp_path, trainer=trainer, **MATCHERS[method])
    spaces = {name.split(".")[0] for name in alignment.transform}
    assert "qk" not in spaces and "heads" in spaces and "experts" in spaces, spaces
    x = next(iter(data))[0]
    with torch.no_grad():
        assert_close_rel(alignment.model(x), hf_b(x).logits, FORWARD, f"{method}: aligned B vs B")


def test_export_reloads_and_matches(tmp_path):
    hf = tiny_qwen3_moe(norm=False)
    model, x = to_canonical(hf), inputs_for(hf)
    loaded = type(hf).from_pretrained(export_hf(model, hf, tmp_path / "out")).eval()
    with torch.no_grad():
        assert_close_rel(loaded(x).logits, hf(x).logits, FORWARD, "exported vs original logits")
    assert torch.allclose(loaded.model.layers[1].self_attn.k_norm.weight, hf.model.layers[1].self_attn.k_norm.weight)


def test_dense_mlp_layers_are_refused():
    hf = tiny_qwen3_moe(layers=1)
    hf.config.decoder_sparse_step = 2
    with pytest.raises(NotImplementedError, match="decoder_sparse_step=2"):
        to_canonical(hf)
