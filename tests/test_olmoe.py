"""OLMoE (one RMSNorm over all heads' queries and one over all keys, blocks.qk_norm_all, with a mixture of
SwiGLU experts, blocks.moe): exact conversion with and without renormalised routing, every admitted symmetry
(head permutations only, no query/key maps, the experts' spaces), weight matching that keeps B, an export that
reloads, clipped queries, keys and values refused."""

import pytest
import torch

import glmc
from glmc.models import to_canonical
from glmc.models.export import export_hf

from family_checks import MATCHERS, assert_symmetry_keeps_function, claimed, next_token_data
from numeric import FEW_OPS, FORWARD, assert_close_rel
from tiny_hf import inputs_for, tiny_olmoe

pytestmark = pytest.mark.numeric


@pytest.mark.parametrize("norm", [False, True], ids=["softmax-weights", "renormalised"])
def test_conversion_matches_hf(norm):
    hf = tiny_olmoe(norm=norm)
    model, x = to_canonical(hf), inputs_for(hf)
    assert model.config.experts_renormalise == norm
    with torch.no_grad():
        assert_close_rel(model(x), hf(x).logits, FEW_OPS, "canonical vs HF logits")


# OLMo-2's attention spaces (no qk, heads permuted only) with Mixtral's experts
CASES = {
    ("residual", "orthogonal"),
    ("residual", "permutation"),
    ("heads", "permutation"),
    ("qheads", "permutation"),
    ("vo", "invertible"),
    ("vo", "orthogonal_scale"),
    ("experts", "permutation"),
    ("expert_units", "permutation"),
}


@pytest.fixture(scope="module")
def olmoe():
    hf = tiny_olmoe()
    return to_canonical(hf), inputs_for(hf)


def test_the_cases_are_what_the_spec_claims(olmoe):
    assert claimed(olmoe[0]) == CASES


@pytest.mark.parametrize("kind,group", sorted(CASES))
def test_symmetry_preserves_function(olmoe, kind, group):
    model, x = olmoe
    assert_symmetry_keeps_function(model, x, {kind: group}, f"{kind} {group}")


@pytest.mark.parametrize("method", ["weight"])  # activation and learned: tests/test_mixtral.py's experts
def test_alignment_keeps_b_without_query_key_maps(method, tmp_path):
    hf_a, hf_b, data = tiny_olmoe(seed=0), tiny_olmoe(seed=1), next_token_data(61)
    trainer = {"accelerator": "cpu", "enable_progress_bar": False}
    alignment = glmc.align(hf_a, hf_b, method, data=data, run_dir=tmp_path, trainer=trainer, **MATCHERS[method])
    spaces = {name.split(".")[0] for name in alignment.transform}
    assert "qk" not in spaces and "heads" in spaces and "experts" in spaces, spaces
    x = next(iter(data))[0]
    with torch.no_grad():
        assert_close_rel(alignment.model(x), hf_b(x).logits, FORWARD, f"{method}: aligned B vs B")


def test_export_reloads_and_matches(tmp_path):
    hf = tiny_olmoe(norm=True)
    model, x = to_canonical(hf), inputs_for(hf)
    loaded = type(hf).from_pretrained(export_hf(model, hf, tmp_path / "out")).eval()
    with torch.no_grad():
        assert_close_rel(loaded(x).logits, hf(x).logits, FORWARD, "exported vs original logits")
    assert torch.allclose(loaded.model.layers[1].self_attn.k_norm.weight, hf.model.layers[1].self_attn.k_norm.weight)


def test_clipped_queries_keys_and_values_are_refused():
    hf = tiny_olmoe(layers=1)
    hf.config.clip_qkv = 8.0
    with pytest.raises(NotImplementedError, match="clip_qkv=8.0"):
        to_canonical(hf)
