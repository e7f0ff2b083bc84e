"""Canonical -> Hugging Face export: reloaded folders compute the canonical logits."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, ViTForImageClassification

from glmc.interpolation import interpolate
from glmc.models import canonical_forward, to_canonical
from glmc.models.export import EXPORT_FILE, export_hf
from glmc.symmetry import Orthogonal, Transform, apply

from numeric import FORWARD, assert_close_rel
from tiny_hf import inputs_for, randomize_layernorms, tiny_gpt2, tiny_vit

pytestmark = pytest.mark.numeric


def char_gpt2(seed=0, vocab=24, hidden=32):
    """A GPT-2 with a character-sized vocabulary (vocab <= width)."""
    torch.manual_seed(seed)
    config = GPT2Config(
        n_embd=hidden, n_layer=2, n_head=4, vocab_size=vocab, n_positions=16, bos_token_id=0, eos_token_id=0
    )
    config.initializer_range = 0.2
    return randomize_layernorms(GPT2LMHeadModel(config), seed).eval()


def _reload(folder, template):
    return type(template).from_pretrained(folder, attn_implementation="eager").eval()


def _check_roundtrip(model, template, folder):
    path = export_hf(model, template, folder)
    assert any(path.glob("*.safetensors"))
    info = json.loads((path / EXPORT_FILE).read_text())
    assert info["canonical_config"] == model.config.to_dict()
    hf = _reload(path, template)
    x = inputs_for(template)
    with torch.no_grad():
        want = canonical_forward(model.config, model.params(), x)
        got = hf(x).logits
    assert_close_rel(got, want, FORWARD, f"reloaded {type(template).__name__} vs canonical logits")
    return hf


@pytest.mark.parametrize("build", [tiny_vit, char_gpt2], ids=["vit", "gpt2"])
def test_export_converted_model(build, tmp_path):
    template = build(0)
    _check_roundtrip(to_canonical(template), template, tmp_path / "m")


@pytest.mark.parametrize("build", [tiny_vit, char_gpt2], ids=["vit", "gpt2"])
def test_export_midpoint_merge(build, tmp_path):
    a, b = to_canonical(build(0)), to_canonical(build(1))
    merged = interpolate([a, b], [0.5, 0.5], circuits=())
    _check_roundtrip(merged, a.source, tmp_path / "mid")


def test_export_gpt2_unties_head_and_ln_f_carries_the_bias(tmp_path):
    template = char_gpt2(0)
    assert template.lm_head.weight is template.transformer.wte.weight
    hf = _check_roundtrip(to_canonical(template), template, tmp_path / "m")
    assert hf.lm_head.weight is not hf.transformer.wte.weight
    assert not hf.config.tie_word_embeddings
    assert hf.transformer.ln_f.bias.abs().max() > 0


def test_export_gpt2_large_vocab_without_merge(tmp_path):
    template = tiny_gpt2(0)  # vocab 97 > width 32: a converted head's bias lies in head.w's column space
    _check_roundtrip(to_canonical(template), template, tmp_path / "m")


def test_export_vit_template_without_qkv_bias(tmp_path):
    template = tiny_vit(0, qkv_bias=False)
    hf = _check_roundtrip(to_canonical(template), template, tmp_path / "m")
    assert hf.config.qkv_bias


def test_orthogonal_residual_map_is_refused(tmp_path):
    model = to_canonical(tiny_vit(0))
    rotated = apply(Transform({"residual": Orthogonal.sample(model.width, torch.Generator().manual_seed(0))}), model)
    with pytest.raises(ValueError, match="mean-zero hyperplane") as info:
        export_hf(rotated, model.source, tmp_path / "r")
    assert "embed.patch_w" in str(info.value) and "residual=permutation" in str(info.value)


def test_circuit_form_and_stacked_heads_are_refused(tmp_path):
    a, b = to_canonical(tiny_vit(0)), to_canonical(tiny_vit(1))
    with pytest.raises(ValueError, match="circuit"):
        export_hf(a.to_circuit(), a.source, tmp_path / "c")
    stacked = interpolate([a, b], [0.5, 0.5], circuits=("qk", "vo"))
    with pytest.raises(ValueError, match="circuit merge"):
        export_hf(stacked, a.source, tmp_path / "s")


def test_gpt2_bias_outside_column_space_is_refused(tmp_path):
    a, b = to_canonical(tiny_gpt2(0)), to_canonical(tiny_gpt2(1))  # vocab 97 > width 32
    merged = interpolate([a, b], [0.5, 0.5])
    with pytest.raises(ValueError, match="column space"):
        export_hf(merged, a.source, tmp_path / "g")


def test_wrong_template_is_refused(tmp_path):
    vit = to_canonical(tiny_vit(0))
    with pytest.raises(ValueError, match="template"):
        export_hf(vit, char_gpt2(0), tmp_path / "w")
    with pytest.raises(TypeError):
        export_hf(vit, torch.nn.Linear(2, 2), tmp_path / "w")
    assert isinstance(vit.source, ViTForImageClassification)
