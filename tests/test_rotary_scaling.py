"""Rotary scaling as Hugging Face computes it (rope_type linear, dynamic, yarn, llama3): the canonical forward
matches the HF model on sequences shorter and longer than the original maximum length (32 positions, or
the original_max_position_embeddings of yarn and llama3), with a partial rotary GPT-NeoX too; the
per-pair rotation-scalings stay symmetries; an export checks the template's scaling.

Dynamic scaling recomputes its frequencies from the sequence length beyond the maximum; the canonical form
does so on every forward, and Hugging Face keeps the longest length's until a shorter sequence than the
maximum comes: the lengths here run short, then long."""

import dataclasses

import pytest
import torch

from glmc.models import to_canonical
from glmc.models.canonical import CanonicalTransformer
from glmc.models.export import to_hf
from glmc.models.families.llama import rope_scaling
from glmc.symmetry import Invertible, SymmetrySpec, Transform, apply

from numeric import FORWARD, assert_close_rel, relative_error
from tiny_hf import tiny_gpt_neox, tiny_llama

pytestmark = pytest.mark.numeric

SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8},
    # with head dim 8 and base 100 the wavelengths 6.3, 20, 63, 200 fall below, inside and above the
    # smoothed band (8, 24)
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 3.0,
        "original_max_position_embeddings": 24,
    },
}
LENGTHS = (11, 40)  # within and beyond the 32 positions of max_position_embeddings


def ids(length: int, vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (2, length), generator=torch.Generator().manual_seed(length))


@pytest.fixture(scope="module", params=list(SCALINGS))
def scaled(request):
    hf = tiny_llama(layers=1, rope=SCALINGS[request.param])
    return request.param, hf, to_canonical(hf)


def test_conversion_matches_hf(scaled):
    name, hf, model = scaled
    assert model.config.rope_scaling["rope_type"] == name
    for length in LENGTHS:
        x = ids(length, hf.config.vocab_size)
        with torch.no_grad():
            assert_close_rel(model(x), hf(x).logits, FORWARD, f"{name}, {length} tokens: canonical vs HF logits")


def test_the_scaling_matters(scaled):
    """Unscaled frequencies give other logits beyond the original length (dynamic: the same within it)."""
    name, hf, model = scaled
    unscaled = CanonicalTransformer(dataclasses.replace(model.config, rope_scaling=None), model.params())
    for length in LENGTHS:
        x = ids(length, hf.config.vocab_size)
        with torch.no_grad():
            change = relative_error(unscaled(x), model(x))[0]
        if name == "dynamic" and length <= 32:
            assert change == 0.0, f"dynamic within the original length: {change:.1e}"
        else:
            assert change > 1e-3, f"{name}, {length} tokens: the scaling made no difference ({change:.1e})"


@pytest.mark.parametrize("rope", ["yarn", "dynamic"])
def test_partial_rotary_gpt_neox_with_scaling_matches_hf(rope):
    """The scaled frequencies belong to the rotating dims alone (8 of 16 per head)."""
    hf = tiny_gpt_neox(layers=1, rotary_pct=0.5, rope=SCALINGS[rope])
    model = to_canonical(hf)
    assert model.config.rotary_dims == 8 and model.config.rope_scaling["rope_type"] == rope
    for length in LENGTHS:
        x = ids(length, hf.config.vocab_size)
        with torch.no_grad():
            assert_close_rel(model(x), hf(x).logits, FORWARD, f"gpt_neox {rope}, {length} tokens")


@pytest.mark.parametrize("name", ["llama3", "yarn"])
def test_rotation_scalings_stay_symmetries(name):
    """Per frequency pair a rotation-scaling (with every other symmetry at once) keeps the logits at both
    lengths; a general invertible query/key map does not."""
    hf = tiny_llama(layers=1, rope=SCALINGS[name])
    model = to_canonical(hf)
    spec, g = SymmetrySpec.from_model(model), torch.Generator().manual_seed(0)
    classes = dict(
        residual="orthogonal", heads="permutation", qheads="permutation", qk="rotary_scale", mlp="permutation"
    )
    moved = apply(Transform.sample(spec, classes, g), model)
    broken = apply(
        Transform({"qk.0": Invertible.sample(spec["qk.0"].heads, spec["qk.0"].size, g)}), model, strict=False
    )
    for length in LENGTHS:
        x = ids(length, hf.config.vocab_size)
        with torch.no_grad():
            assert_close_rel(moved(x), model(x), FORWARD, f"{name}, {length} tokens: transformed vs original")
            change = relative_error(broken(x), model(x))[0]
        assert change > 1e-2, f"{name}, {length} tokens: a general qk map kept the logits ({change:.1e})"


def test_export_keeps_the_scaling_and_refuses_another(scaled):
    name, hf, model = scaled
    x = ids(LENGTHS[-1], hf.config.vocab_size)
    exported = to_hf(model, hf)
    assert rope_scaling(exported.config) == model.config.rope_scaling
    with torch.no_grad():
        assert_close_rel(exported(x).logits, hf(x).logits, FORWARD, f"{name}: exported vs original logits")
    other = "linear" if name != "linear" else "yarn"
    with pytest.raises(ValueError, match="the template's rotary scaling .* is not the model's"):
        to_hf(model, tiny_llama(layers=1, rope=SCALINGS[other]))
    with pytest.raises(ValueError, match="the template's rotary scaling None is not the model's"):
        to_hf(model, tiny_llama(layers=1))


def test_unsupported_rotary_types_are_refused():
    from transformers import LlamaConfig

    cfg = LlamaConfig(hidden_size=32, num_attention_heads=4, max_position_embeddings=32)
    cfg.rope_parameters = {"rope_type": "longrope", "rope_theta": 100.0}
    with pytest.raises(NotImplementedError, match="'longrope'"):
        rope_scaling(cfg)
