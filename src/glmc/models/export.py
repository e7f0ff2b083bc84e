"""Factored canonical model -> Hugging Face model folder (the inverse of the converters).

Every LayerNorm becomes the identity affine map (weight 1, bias 0, eps = config.norm_eps) and the
canonical readers are written as they are, since the converters folded the norms into them. This is
exact while the residual stream stays mean-zero: HF's LayerNorm subtracts the mean, the canonical
RMS norm does not, so every residual writer must have zero mean over the width. Attention scaling is
divided back out of q, and GPT-2's lm_head, which has no bias, gets head.b through ln_f's bias beta
with head.w @ beta = head.b (solvable when head.b lies in the column space of head.w).
"""

from __future__ import annotations

import copy
import inspect
import json
from pathlib import Path

import torch
from torch import Tensor

from glmc.models.canonical import CanonicalTransformer, num_layers

EXPORT_FILE = "glmc_export.json"

# residual writers and the axis that runs over the width
_WRITERS = {
    "embed.patch_w": 0,
    "embed.patch_b": 0,
    "embed.cls": 0,
    "embed.tokens": 1,
    "embed.pos": 1,
    "o_w": 1,
    "o_b": 0,
    "out_w": 0,
    "out_b": 0,
}


def _check_mean_zero(params: dict[str, Tensor], tol: float = 1e-6) -> None:
    for name, t in params.items():
        axis = _WRITERS.get(name, _WRITERS.get(name.rsplit(".", 1)[-1]))
        if axis is None:
            continue
        t = t.detach().double()
        scale = t.abs().max().item()
        if scale > 0 and t.mean(axis).abs().max().item() > tol * scale:
            raise ValueError(
                f"{name} has a non-zero mean over the residual width: the alignment's residual map moved the "
                "stream out of the mean-zero hyperplane (unrestricted orthogonal residual maps do), and a Hugging "
                "Face LayerNorm, which subtracts the mean, cannot reproduce the canonical RMS norm; to export, "
                "align with matcher.<method>.keep_mean=auto (weight matching), or residual=permutation or none"
            )


def _check_model(model: CanonicalTransformer, family: str) -> dict[str, Tensor]:
    if not isinstance(model, CanonicalTransformer):
        raise TypeError(f"export_hf takes a canonical model, got {type(model).__name__}")
    if model.config.form != "factored":
        raise ValueError(
            "export_hf needs a factored canonical model: circuit-form attention (QK, OV of size D+1) has no "
            "Hugging Face shape"
        )
    if model.config.family != family:
        raise ValueError(f"a {model.config.family} canonical model cannot be written into a {family} template")
    if model.config.norm_dim != model.width:
        raise ValueError(
            f"the model was widened (width {model.width}, norm_dim {model.config.norm_dim}): a Hugging Face "
            "LayerNorm normalises over the full width, so only models with norm_dim == width export"
        )
    params = {k: v.detach() for k, v in model.params().items()}
    _check_mean_zero(params)
    return params


def _check_heads(params: dict[str, Tensor], layers: int, heads: int, head_dim: int) -> None:
    if num_layers(params) != layers:
        raise ValueError(f"the model has {num_layers(params)} layers, the template {layers}")
    for layer in range(layers):
        for n in ("q_w", "k_w", "v_w"):
            shape = tuple(params[f"blocks.{layer}.{n}"].shape[:2])
            if shape != (heads, head_dim):
                raise ValueError(
                    f"blocks.{layer}.{n} has (heads, head dim) {shape} but the template has {(heads, head_dim)}: "
                    "heads stacked by a circuit merge (head rank up to 2 * d_head) or widened have no "
                    "Hugging Face shape"
                )


def _set(module_param: Tensor, value: Tensor, name: str) -> None:
    if tuple(module_param.shape) != tuple(value.shape):
        shapes = f"canonical shape {tuple(value.shape)} but the template has {tuple(module_param.shape)}"
        raise ValueError(f"{name}: {shapes}")
    module_param.copy_(value.to(module_param.dtype))


def _identity_norm(norm: torch.nn.LayerNorm) -> None:
    norm.weight.fill_(1.0)
    norm.bias.zero_()


def _fresh(template: torch.nn.Module, **overrides):
    config = copy.deepcopy(template.config)
    for key, value in overrides.items():
        setattr(config, key, value)
    dtype = next(template.parameters()).dtype
    return type(template)(config).to(dtype).eval()


def _vit(model: CanonicalTransformer, template) -> torch.nn.Module:
    from glmc.models.canonical import canonical_activation

    params = _check_model(model, "vit")
    p = lambda n: params[n].double()  # noqa: E731
    cfg = template.config
    if canonical_activation(cfg.hidden_act) != model.config.activation:
        raise ValueError(f"the template's activation {cfg.hidden_act!r} is not the model's {model.config.activation!r}")
    if model.width != cfg.hidden_size:
        raise ValueError(f"model width {model.width} but the template's hidden_size is {cfg.hidden_size}")
    _check_heads(params, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads)
    hf = _fresh(template, layer_norm_eps=model.config.norm_eps, qkv_bias=True)  # canonical q/k/v always have biases
    vit, D = hf.vit, model.width
    emb = vit.embeddings
    _set(emb.patch_embeddings.projection.weight, p("embed.patch_w"), "embed.patch_w")
    _set(emb.patch_embeddings.projection.bias, p("embed.patch_b"), "embed.patch_b")
    _set(emb.cls_token, p("embed.cls").reshape(1, 1, D), "embed.cls")
    _set(emb.position_embeddings, p("embed.pos")[None], "embed.pos")
    for i, layer in enumerate(vit.layers):
        attn, pre = layer.attention, f"blocks.{i}."
        _identity_norm(layer.layernorm_before)
        _identity_norm(layer.layernorm_after)
        for name, lin, scale in (("q", attn.q_proj, attn.scaling), ("k", attn.k_proj, 1.0), ("v", attn.v_proj, 1.0)):
            _set(lin.weight, p(pre + name + "_w").flatten(0, 1) / scale, pre + name + "_w")
            _set(lin.bias, p(pre + name + "_b").flatten() / scale, pre + name + "_b")
        _set(attn.o_proj.weight, p(pre + "o_w").permute(1, 0, 2).flatten(1), pre + "o_w")
        _set(attn.o_proj.bias, p(pre + "o_b"), pre + "o_b")
        _set(layer.mlp.fc1.weight, p(pre + "in_w"), pre + "in_w")
        _set(layer.mlp.fc1.bias, p(pre + "in_b"), pre + "in_b")
        _set(layer.mlp.fc2.weight, p(pre + "out_w"), pre + "out_w")
        _set(layer.mlp.fc2.bias, p(pre + "out_b"), pre + "out_b")
    _identity_norm(vit.layernorm)
    _set(hf.classifier.weight, p("head.w"), "head.w")
    _set(hf.classifier.bias, p("head.b"), "head.b")
    return hf


def head_bias_offset(head_w: Tensor, head_b: Tensor, tol: float = 1e-6) -> Tensor:
    """beta with head_w @ beta = head_b (least squares, float64), for a head without a bias that reads
    a LayerNorm with bias beta; ValueError when the relative residual exceeds tol."""
    w, b = head_w.double(), head_b.double()
    beta = torch.linalg.lstsq(w, b[:, None], driver="gelsd").solution[:, 0]
    scale = b.norm().item()
    residual = (w @ beta - b).norm().item()
    if scale > 0 and residual > tol * scale:
        raise ValueError(
            f"head.b is not in the column space of head.w (relative residual {residual / scale:.2e}): a GPT-2 "
            f"lm_head has no bias, and with vocabulary {w.shape[0]} > width {w.shape[1]} ln_f's bias cannot "
            "carry this one, so the model has no GPT-2 equivalent"
        )
    return beta


def _gpt2(model: CanonicalTransformer, template) -> torch.nn.Module:
    from glmc.models.canonical import canonical_activation

    params = _check_model(model, "gpt2")
    p = lambda n: params[n].double()  # noqa: E731
    cfg = template.config
    if canonical_activation(cfg.activation_function) != model.config.activation:
        raise ValueError(
            f"the template's activation {cfg.activation_function!r} is not the model's {model.config.activation!r}"
        )
    if model.width != cfg.n_embd:
        raise ValueError(f"model width {model.width} but the template's n_embd is {cfg.n_embd}")
    _check_heads(params, cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head)
    beta = head_bias_offset(p("head.w"), p("head.b"))
    # head.w differs from the token embedding (folding, merging): the head must not be tied
    hf = _fresh(template, layer_norm_epsilon=model.config.norm_eps, tie_word_embeddings=False)
    tr, D = hf.transformer, model.width
    _set(tr.wte.weight, p("embed.tokens"), "embed.tokens")
    _set(tr.wpe.weight, p("embed.pos"), "embed.pos")
    for i, block in enumerate(tr.h):
        attn, pre = block.attn, f"blocks.{i}."
        _identity_norm(block.ln_1)
        _identity_norm(block.ln_2)
        # Conv1D weights are (in, out); c_attn packs Q, K, V along its output axis
        scales = (attn.scaling, 1.0, 1.0)
        w = torch.cat([p(pre + n + "_w").reshape(D, D) / s for n, s in zip("qkv", scales)], 0)
        b = torch.cat([p(pre + n + "_b").flatten() / s for n, s in zip("qkv", scales)], 0)
        _set(attn.c_attn.weight, w.T, pre + "q_w, k_w, v_w")
        _set(attn.c_attn.bias, b, pre + "q_b, k_b, v_b")
        _set(attn.c_proj.weight, p(pre + "o_w").permute(1, 0, 2).flatten(1).T, pre + "o_w")
        _set(attn.c_proj.bias, p(pre + "o_b"), pre + "o_b")
        _set(block.mlp.c_fc.weight, p(pre + "in_w").T, pre + "in_w")
        _set(block.mlp.c_fc.bias, p(pre + "in_b"), pre + "in_b")
        _set(block.mlp.c_proj.weight, p(pre + "out_w").T, pre + "out_w")
        _set(block.mlp.c_proj.bias, p(pre + "out_b"), pre + "out_b")
    tr.ln_f.weight.fill_(1.0)
    tr.ln_f.bias.copy_(beta.to(tr.ln_f.bias.dtype))
    if hf.lm_head.weight is tr.wte.weight:
        raise ValueError("the exported GPT-2 still ties lm_head to wte: cannot write a separate head")
    _set(hf.lm_head.weight, p("head.w"), "head.w")
    return hf


@torch.no_grad()
def to_hf(model: CanonicalTransformer, template: torch.nn.Module) -> torch.nn.Module:
    """The Hugging Face model (of the template's class and config) computing what `model` computes."""
    from transformers import GPT2LMHeadModel, ViTForImageClassification

    if isinstance(template, ViTForImageClassification):
        return _vit(model, template)
    if isinstance(template, GPT2LMHeadModel):
        return _gpt2(model, template)
    raise TypeError(
        f"no exporter for a {type(template).__name__} template; supported: ViTForImageClassification, GPT2LMHeadModel"
    )


def export_hf(model: CanonicalTransformer, template: torch.nn.Module, folder: str | Path) -> Path:
    """Write a factored canonical model as a Hugging Face model folder (safetensors) beside a
    glmc_export.json with the canonical config; `template` is an HF model of the same architecture
    (e.g. the source of endpoint A). Raises ValueError for models with no exact HF equivalent."""
    hf = to_hf(model, template)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    options = {}
    if "safe_serialization" in inspect.signature(hf.save_pretrained).parameters:  # transformers < 5
        options["safe_serialization"] = True
    hf.save_pretrained(folder, **options)
    info = {"architecture": type(hf).__name__, "canonical_config": model.config.to_dict()}
    (folder / EXPORT_FILE).write_text(json.dumps(info, indent=2) + "\n")
    return folder
