"""The canonical Transformer reproduces Hugging Face ViT and GPT-2 logits to float32 precision."""

import json

import pytest
import torch

from glmc.models import CanonicalConfig, CanonicalTransformer, canonical_forward, to_canonical

from numeric import FEW_OPS, FORWARD, assert_close_rel
from tiny_hf import inputs_for, tiny_gpt2, tiny_vit

MODELS = {
    "vit-gelu": lambda: tiny_vit(),
    "vit-relu-2heads-nobias-rgb": lambda: tiny_vit(
        1, hidden=24, heads=2, mlp=40, act="relu", qkv_bias=False, channels=3, patch=4
    ),
    "vit-gelu_new-8heads": lambda: tiny_vit(2, hidden=32, heads=8, mlp=48, act="gelu_new", layers=3),
    "gpt2-gelu_new": lambda: tiny_gpt2(),
    "gpt2-relu-2heads": lambda: tiny_gpt2(1, hidden=24, heads=2, mlp=40, act="relu"),
    "gpt2-gelu-inverse-layer-scale": lambda: tiny_gpt2(2, act="gelu", layers=3, scale_attn_by_inverse_layer_idx=True),
}


@pytest.fixture(scope="module", params=list(MODELS))
def hf_model(request):
    return request.param, MODELS[request.param]()


@pytest.mark.numeric
@pytest.mark.parametrize("form", ["factored", "circuit"])
def test_conversion_matches_hf(hf_model, form):
    name, model = hf_model
    x = inputs_for(model)
    canonical = to_canonical(model)
    if form == "circuit":
        canonical = canonical.to_circuit()
    with torch.no_grad():
        ref, out = model(x).logits, canonical(x)
    assert out.shape == ref.shape
    dev = assert_close_rel(out, ref, FORWARD, f"conversion {name} {form}: canonical vs HF logits")
    print(f"\n  conversion {name} {form}: relative logit deviation {dev:.2e}")


def test_vit_parameter_layout():
    c = to_canonical(tiny_vit(hidden=32, heads=4, mlp=64))
    shapes = {k: tuple(v.shape) for k, v in c.state_dict().items()}
    assert shapes["embed.patch_w"] == (32, 1, 2, 2) and shapes["embed.patch_b"] == (32,)
    assert shapes["embed.cls"] == (32,) and shapes["embed.pos"] == (17, 32)
    assert shapes["blocks.1.q_w"] == (4, 8, 32) and shapes["blocks.1.q_b"] == (4, 8)
    assert shapes["blocks.1.o_w"] == (4, 32, 8) and shapes["blocks.1.in_w"] == (64, 32)
    assert shapes["blocks.1.out_w"] == (32, 64) and shapes["head.w"] == (10, 32)
    assert c.num_layers == 2 and c.width == 32
    circuit = c.to_circuit().state_dict()
    assert tuple(circuit["blocks.0.qk"].shape) == (4, 33, 33) and tuple(circuit["blocks.0.ov"].shape) == (4, 32, 33)
    assert not any(k.endswith(("q_w", "k_w", "v_w", "o_w")) for k in circuit)


def test_gpt2_layout_and_untied_head():
    model = tiny_gpt2()
    c = to_canonical(model)
    p = c.state_dict()
    assert tuple(p["embed.tokens"].shape) == (97, 32) and tuple(p["embed.pos"].shape) == (16, 32)
    assert tuple(p["head.w"].shape) == (97, 32) and tuple(p["head.b"].shape) == (97,)
    assert not torch.allclose(p["embed.tokens"], p["head.w"])  # untied: centred writer vs folded reader
    assert c.config.causal and c.config.pooling == "none" and c.config.activation == "gelu_tanh"


def assert_centred(weight, dim, what):
    """The means along `dim` vanish up to round-off: measured against the norm those means would have
    if each were as large as the root mean square of the entries."""
    means = weight.double().mean(dim)
    floor = float(weight.double().pow(2).mean().sqrt()) * means.numel() ** 0.5
    assert_close_rel(means, torch.zeros_like(means), FEW_OPS, what, floor=floor)


@pytest.mark.numeric
def test_residual_writers_are_centred():
    # the stream must have zero mean for LayerNorm to equal gamma * rms + beta
    p = to_canonical(tiny_gpt2()).state_dict()
    assert_centred(p["embed.tokens"], 1, "embed.tokens")
    assert_centred(p["blocks.0.o_w"], 1, "blocks.0.o_w")
    assert_centred(p["blocks.1.out_w"], 0, "blocks.1.out_w")


def test_config_roundtrip_through_json():
    model = tiny_vit()
    c = to_canonical(model)
    config = CanonicalConfig.from_dict(json.loads(json.dumps(c.config.to_dict())))
    rebuilt = CanonicalTransformer(config, c.state_dict())
    x = inputs_for(model)
    with torch.no_grad():
        assert torch.equal(rebuilt(x), c(x))


def test_forward_is_differentiable_in_params():
    model = tiny_gpt2()
    a, b = to_canonical(model), to_canonical(tiny_gpt2(seed=5))
    lam = torch.tensor(0.3, requires_grad=True)
    params = {k: (1 - lam) * v.detach() + lam * b.params()[k].detach() for k, v in a.params().items()}
    logits = canonical_forward(a.config, params, inputs_for(model))
    logits.logsumexp(-1).mean().backward()
    assert lam.grad is not None and torch.isfinite(lam.grad)


def test_clone_is_independent():
    c = to_canonical(tiny_vit())
    d = c.clone()
    with torch.no_grad():
        d.head["b"].add_(1.0)
    assert not torch.equal(c.head["b"], d.head["b"])


def test_unsupported_model_raises_type_error():
    with pytest.raises(TypeError, match="Linear"):
        to_canonical(torch.nn.Linear(2, 2))


def test_unknown_activation_is_rejected():
    with pytest.raises(ValueError, match="relu6"):
        CanonicalConfig("vit", "relu6", 1e-5, 8, False, "cls")
