"""Gemma (RMSNorm gain 1 + w, embeddings scaled by sqrt(width), GeGLU, head_dim of its own, tied head):
exact conversion, every symmetry its spec claims, matchers that keep B, an untied export, and run.py on
two folders."""

import pytest
import torch

from glmc.models import to_canonical
from glmc.models.export import export_hf

from family_checks import (
    MATCHERS,
    assert_alignment_keeps_b,
    assert_symmetry_keeps_function,
    claimed,
    cli_on_two_folders,
    next_token_data,
)
from numeric import FEW_OPS, FORWARD, assert_close_rel
from tiny_hf import inputs_for, tiny_gemma

pytestmark = pytest.mark.numeric


@pytest.fixture(scope="module")
def gemma():
    hf = tiny_gemma()
    return hf, to_canonical(hf), inputs_for(hf)


def test_conversion_matches_hf(gemma):
    hf, model, x = gemma
    assert hf.config.tie_word_embeddings and hf.config.head_dim * hf.config.num_attention_heads != hf.config.hidden_size
    assert model.config.activation == "gelu_tanh" and model.task == "causal_lm"
    with torch.no_grad():
        assert_close_rel(model(x), hf(x).logits, FORWARD, "canonical vs HF logits")
        # the scaled embedding and the head: embedding times the final norm's gain 1 + w
        assert_close_rel(model.params()["embed.tokens"][x], hf.model.embed_tokens(x), FEW_OPS, "embedding")
        gain = 1 + hf.model.norm.weight
        assert_close_rel(model.params()["head.w"], hf.model.embed_tokens.weight * gain, FEW_OPS, "head")


def test_embedding_scale_is_rounded_to_the_weights_dtype():
    """A bfloat16 Gemma multiplies by sqrt(24) rounded to bfloat16 (4.90625); the canonical model (float32)
    holds the exact products, which round to the model's own embeddings."""
    hf = tiny_gemma(hidden=24, layers=1).to(torch.bfloat16)
    scale = torch.tensor(24**0.5, dtype=torch.bfloat16).item()
    assert scale == 4.90625
    tokens = to_canonical(hf).params()["embed.tokens"]
    assert torch.equal(tokens, hf.model.embed_tokens.weight.float() * scale)
    ids = torch.arange(hf.config.vocab_size)[None]
    with torch.no_grad():
        assert torch.equal(tokens[ids].to(torch.bfloat16), hf.model.embed_tokens(ids))


def test_legacy_gelu_is_the_tanh_approximation():
    """GemmaConfig reads hidden_act="gelu" (the released configs' value) as the tanh approximation."""
    hf = tiny_gemma(act="gelu", layers=1)
    x = inputs_for(hf)
    model = to_canonical(hf)
    assert model.config.activation == "gelu_tanh"
    with torch.no_grad():
        assert_close_rel(model(x), hf(x).logits, FORWARD, "gelu config: canonical vs HF logits")


def test_bidirectional_attention_is_refused():
    with pytest.raises(NotImplementedError, match="use_bidirectional_attention=True"):
        to_canonical(tiny_gemma(layers=1, use_bidirectional_attention=True))


CASES = {
    ("residual", "orthogonal"),
    ("residual", "signed_permutation"),
    ("residual", "permutation"),
    ("heads", "permutation"),
    ("heads", "semi_permutation"),
    ("qheads", "permutation"),
    ("qk", "rotary_scale"),
    ("vo", "invertible"),
    ("vo", "orthogonal_scale"),
    ("mlp", "permutation"),
    ("mlp_scale", "diagonal"),
}


def test_the_cases_are_what_the_spec_claims(gemma):
    assert claimed(gemma[1]) == CASES


@pytest.mark.parametrize("kind,group", sorted(CASES))
def test_symmetry_preserves_function(gemma, kind, group):
    _, model, x = gemma
    assert_symmetry_keeps_function(model, x, {kind: group}, f"{kind} {group}")


def test_all_symmetries_at_once_preserve_function(gemma):
    _, model, x = gemma
    dropped = {("heads", "semi_permutation"), ("residual", "permutation"), ("residual", "signed_permutation")}
    classes = dict(CASES - dropped - {("vo", "orthogonal_scale")})
    assert_symmetry_keeps_function(model, x, classes, "all at once")


@pytest.fixture(scope="module")
def pair():
    return tiny_gemma(seed=0), tiny_gemma(seed=1), next_token_data(61)


@pytest.mark.parametrize("method", list(MATCHERS))
def test_alignment_keeps_b(pair, method, tmp_path):
    hf_a, hf_b, data = pair
    assert_alignment_keeps_b(hf_a, hf_b, method, data, tmp_path)


def test_untied_export_reloads_and_matches(gemma, tmp_path):
    hf, model, x = gemma
    loaded = type(hf).from_pretrained(export_hf(model, hf, tmp_path / "out")).eval()
    assert not loaded.config.tie_word_embeddings
    assert loaded.lm_head.weight.data_ptr() != loaded.model.embed_tokens.weight.data_ptr()
    with torch.no_grad():
        assert_close_rel(loaded(x).logits, hf(x).logits, FORWARD, "exported vs original logits")


def test_command_line_on_two_folders(monkeypatch, capsys, tmp_path):
    cli_on_two_folders(
        monkeypatch, capsys, tmp_path, "gemma", hidden_act="gelu_pytorch_tanh", tie_embeddings=True, max_positions=16
    )
