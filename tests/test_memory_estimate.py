"""benchmarks/memory_estimate.py: the learned-matching memory estimate, part by part, against counts made here
from the models' configs and spaces, and its activations against what autograd keeps in a forward."""

from __future__ import annotations

import sys

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from glmc.interpolation import merge_params
from glmc.models import canonical_forward, to_canonical
from glmc.symmetry import SymmetrySpec

from conftest import ROOT
from tiny_hf import tiny_gpt2, tiny_vit

sys.path.insert(0, str(ROOT / "benchmarks"))
from memory_estimate import activation_entries, learned_matching_memory  # noqa: E402  (benchmarks/memory_estimate.py)

WIDTH, HEADS, HEAD_DIM, MLP, LAYERS, VOCAB = 32, 8, 4, 48, 2, 61


def tiny_llama(kv_heads: int, seed: int = 0):
    torch.manual_seed(seed)
    config = LlamaConfig(
        hidden_size=WIDTH,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=kv_heads,
        head_dim=HEAD_DIM,
        intermediate_size=MLP,
        vocab_size=VOCAB,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        bos_token_id=None,
        eos_token_id=None,
    )
    return to_canonical(LlamaForCausalLM(config))


@pytest.fixture(scope="module")
def models():
    return {
        "gpt2": to_canonical(tiny_gpt2(layers=LAYERS)),
        "vit": to_canonical(tiny_vit(layers=LAYERS)),
        "grouped": tiny_llama(kv_heads=2),
        "multi_head": tiny_llama(kv_heads=HEADS),
    }


def parameter_count(model) -> int:
    return sum(t.numel() for t in model.parameters())


@pytest.mark.parametrize("name", ["gpt2", "vit", "grouped", "multi_head"])
@pytest.mark.parametrize("bytes_per_float", [4, 2])
def test_endpoints_are_both_models(models, name, bytes_per_float):
    model = models[name]
    estimate = learned_matching_memory(model, 2, 8, bytes_per_float)
    assert estimate["endpoints"] == 2 * parameter_count(model) * bytes_per_float


def latent_entries(width: int, units_per_layer: list[tuple[int, int]], residual=True, heads=True, mlp=True) -> int:
    """n^2 summed over the latents: the residual, and per layer (heads, MLP units)."""
    total = width**2 if residual else 0
    for h, f in units_per_layer:
        total += (h**2 if heads else 0) + (f**2 if mlp else 0)
    return total


def test_latents_from_the_configs(models):
    gpt2 = models["gpt2"]
    # tiny_gpt2: width 32, 4 heads, MLP 4 x width
    expected = latent_entries(32, [(4, 128)] * LAYERS)
    estimate = learned_matching_memory(gpt2, 1, 8)
    assert estimate["latents"] == 3 * 4 * expected  # latent and AdamW's two moments, float32
    assert estimate["latent_grads"] == 4 * expected
    # grouped-query: one latent per key/value group, not per query head
    for name, kv in (("grouped", 2), ("multi_head", HEADS)):
        expected = latent_entries(WIDTH, [(kv, MLP)] * LAYERS)
        assert learned_matching_memory(models[name], 1, 8)["latents"] == 3 * 4 * expected
    off = (({"residual": "none"}, {"residual": False}), ({"heads": False}, {"heads": False}), ({"mlp": False},) * 2)
    for setting, counted in off:
        expected = latent_entries(32, [(4, 128)] * LAYERS, **counted)
        assert learned_matching_memory(gpt2, 1, 8, **setting)["latents"] == 3 * 4 * expected


def test_latents_match_the_spec_spaces(models):
    """Independently of the configs: every residual, heads and mlp space of the spec, n x n."""
    for model in models.values():
        spec = SymmetrySpec.from_model(model)
        entries = sum(s.size**2 for s in spec if s.kind in ("residual", "heads", "mlp"))
        assert learned_matching_memory(model, 1, 4)["latents"] == 3 * 4 * entries


@pytest.mark.parametrize("name", ["gpt2", "vit", "grouped"])
def test_activations_linear_in_batch(models, name):
    model = models[name]
    seq = 65 if name == "vit" else 16  # ViT: 8x8 images of 2x2 patches and the class token
    one = learned_matching_memory(model, 1, seq)
    for batch in (2, 3, 8):
        estimate = learned_matching_memory(model, batch, seq)
        assert estimate["activations"] == batch * one["activations"]
        weights = [k for k in one if k not in ("activations", "total")]
        assert all(estimate[k] == one[k] for k in weights)  # nothing else depends on the batch
    assert learned_matching_memory(model, 8, seq)["total"] > one["total"]


def test_grouped_and_multi_head_differ_where_they_should(models):
    grouped = learned_matching_memory(models["grouped"], 4, 16)
    multi = learned_matching_memory(models["multi_head"], 4, 16)
    # k and v weights and biases: 2 kv heads instead of 8, (dh, D + 1) each, per layer, in both endpoints
    assert multi["endpoints"] - grouped["endpoints"] == 2 * LAYERS * 2 * (HEADS - 2) * HEAD_DIM * (WIDTH + 1) * 4
    assert multi["latents"] - grouped["latents"] == 3 * LAYERS * (HEADS**2 - 2**2) * 4
    # the forward repeats every key/value head for its query heads: what it keeps is the same
    assert multi["activations"] == grouped["activations"]


def test_circuits_stack_both_models_heads(models):
    gpt2 = models["gpt2"]
    circuit = learned_matching_memory(gpt2, 4, 16)  # GPT-2's default: qk and vo as circuits
    factored = learned_matching_memory(gpt2, 4, 16, circuits=())
    # q, k, v weights and biases (D + 1 columns each) and o_w, per layer
    head_tensors = LAYERS * (3 * 32 * 33 + 32 * 32)
    assert circuit["interpolated"] - factored["interpolated"] == head_tensors * 4
    # per position and layer: H (dq + dk + 2 dv) more, the head dims doubled
    assert circuit["activations"] - factored["activations"] == 4 * 16 * LAYERS * 4 * (8 + 8 + 2 * 8) * 4
    with pytest.raises(ValueError, match="circuits"):
        learned_matching_memory(gpt2, 1, 8, circuits=("mlp",))


def saved_for_backward(model, inputs, circuits) -> int:
    """Bytes of the tensors autograd keeps from the forward of the midpoint lam A + (1 - lam) B (B a
    copy of the model whose weights require gradients, as T(B)'s do), the weights themselves not
    counted: each storage once."""
    a = {k: v.detach() for k, v in model.params().items()}
    b = {k: v.detach().clone().requires_grad_() for k, v in a.items()}
    params = merge_params([a, b], [0.5, 0.5], circuits)
    weights = {t.untyped_storage().data_ptr() for t in (*a.values(), *b.values(), *params.values())}
    kept = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        canonical_forward(model.config, params, inputs)
    return sum(kept.values())


@pytest.mark.parametrize("name", ["gpt2", "gpt2_factored", "grouped", "vit"])
def test_activations_are_what_autograd_keeps(models, name):
    """The kept activations per position against the tensors the forward saves for its backward (the
    batch-dependent part: the difference between batches 4 and 1), and the whole, with the copies of
    o_w, against all it saves."""
    model = models["gpt2" if name == "gpt2_factored" else name]
    circuits = () if name in ("gpt2_factored", "grouped") else ("qk", "vo")
    seq = 17 if name == "vit" else 16  # ViT: 8x8 images of 2x2 patches and the class token

    def inputs(batch):
        generator = torch.Generator().manual_seed(batch)
        if name == "vit":
            return torch.randn(batch, 1, 8, 8, generator=generator)
        return torch.randint(0, model.params()["embed.tokens"].shape[0], (batch, seq), generator=generator)

    measured = {batch: saved_for_backward(model, inputs(batch), circuits) for batch in (1, 4)}
    kept = {batch: 4 * activation_entries(model, batch, seq, circuits)[0] for batch in (1, 4)}
    assert kept[4] - kept[1] == pytest.approx(measured[4] - measured[1], rel=0.02)
    copies = learned_matching_memory(model, 1, seq, circuits=circuits)["forward_weights"]
    assert kept[1] + copies == pytest.approx(measured[1], rel=0.05)
