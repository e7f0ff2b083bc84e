"""The ViT family: Hugging Face ViTForImageClassification <-> canonical Transformer.

Canonical embedding tensors: embed.patch_w (D, C, p, p), embed.patch_b (D), embed.cls (D), embed.pos
(T, D); head.w (classes, D), head.b (classes), read from the class token.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import ViTConfig, ViTForImageClassification

from glmc.models.canonical import CanonicalConfig, CanonicalTransformer
from glmc.models.export import check_model, check_template, fresh, identity_norm, set_modules, set_param, set_qkv
from glmc.models.families.base import Family, encoder_sizes
from glmc.models.families.fold import StoredAs, center, common_eps, fold_block, fold_norm, weights64
from glmc.models.families.roles import linear_head, writer
from glmc.ranges import finite_number


@torch.no_grad()
def vit_to_canonical(model: ViTForImageClassification) -> CanonicalTransformer:
    if not isinstance(model.classifier, torch.nn.Linear):
        raise ValueError("ViT without a linear classifier (num_labels=0) has no logits to convert")
    vit, cfg = model.vit, model.config
    dtype = model.classifier.weight.dtype
    g = lambda t: t.detach().double()  # noqa: E731  fold in float64, cast back per tensor (StoredAs)
    proj = vit.embeddings.patch_embeddings.projection
    if proj.stride[0] != proj.stride[1] or proj.kernel_size != proj.stride:
        raise NotImplementedError(f"non-square or overlapping patches {proj.kernel_size}, {proj.stride}")
    D = cfg.hidden_size

    p = StoredAs(dtype)
    p |= {
        "embed.patch_w": center(g(proj.weight), 0),
        "embed.patch_b": center(g(proj.bias), 0),
        "embed.cls": center(g(vit.embeddings.cls_token).reshape(D), 0),
        "embed.pos": center(g(vit.embeddings.position_embeddings)[0], 1),
    }
    for i, layer in enumerate(vit.layers):
        attn = layer.attention
        lins = ((attn.q_proj, attn.scaling), (attn.k_proj, 1.0), (attn.v_proj, 1.0))
        qkv = [(g(lin.weight), None if lin.bias is None else g(lin.bias), s) for lin, s in lins]
        norms = weights64(layer.layernorm_before), weights64(layer.layernorm_after)
        o, mlp = weights64(attn.o_proj), (weights64(layer.mlp.fc1), weights64(layer.mlp.fc2))
        p |= fold_block(f"blocks.{i}.", attn.num_attention_heads, norms[0], qkv, o, norms[1], *mlp)
    final = vit.layernorm
    p["head.w"], p["head.b"] = fold_norm(*weights64(model.classifier), *weights64(final))

    norms = [final] + [n for layer in vit.layers for n in (layer.layernorm_before, layer.layernorm_after)]
    config = CanonicalConfig(
        family="vit",
        activation=cfg.hidden_act,
        norm_eps=common_eps(norms),
        norm_dim=D,
        causal=False,
        pooling="cls",
        patch_size=proj.stride[0],
        num_channels=proj.in_channels,
    )
    return CanonicalTransformer(config, dict(p), copy=False)


def vit_from_canonical(model: CanonicalTransformer, template: ViTForImageClassification) -> ViTForImageClassification:
    params = check_model(model, "vit")
    p = lambda n: params[n].double()  # noqa: E731
    cfg = template.config
    heads = (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads)
    check_template(model, cfg.hidden_act, "hidden_size", cfg.hidden_size, heads)
    hf = fresh(template, layer_norm_eps=model.config.norm_eps, qkv_bias=True)  # canonical q/k/v always have biases
    vit, D = hf.vit, model.width
    emb = vit.embeddings
    set_param(emb.patch_embeddings.projection.weight, p("embed.patch_w"), "embed.patch_w")
    set_param(emb.patch_embeddings.projection.bias, p("embed.patch_b"), "embed.patch_b")
    set_param(emb.cls_token, p("embed.cls").reshape(1, 1, D), "embed.cls")
    set_param(emb.position_embeddings, p("embed.pos")[None], "embed.pos")
    for i, layer in enumerate(vit.layers):
        attn, pre = layer.attention, f"blocks.{i}."
        identity_norm(layer.layernorm_before)
        identity_norm(layer.layernorm_after)
        set_qkv(p, pre, ((attn.q_proj, attn.scaling), (attn.k_proj, 1.0), (attn.v_proj, 1.0)))
        set_param(attn.o_proj.weight, p(pre + "o_w").permute(1, 0, 2).flatten(1), pre + "o_w")
        set_param(attn.o_proj.bias, p(pre + "o_b"), pre + "o_b")
        set_modules(p, {pre + "in_": layer.mlp.fc1, pre + "out_": layer.mlp.fc2})
    identity_norm(vit.layernorm)
    set_modules(p, {"head.": hf.classifier})
    return hf


class ViTFamily(Family):
    name = "vit"
    model_types = ("vit",)
    hf_classes = ("ViTForImageClassification",)
    data_kind = "images"
    tasks = ("classification",)
    shared_model_keys = ("qkv_bias", "image_size", "patch_size", "num_channels", "num_labels")
    model_keys = ("image_size", "patch_size", "num_channels", "num_labels", "qkv_bias")

    def model_problems(self, model: Any, prefix: str, checked: set[str]) -> list[str]:
        """Patches must tile the image: a remainder would be cut off without a word."""
        size, patch = model.image_size, model.patch_size
        if not {"patch_size", "image_size"} & checked or not (finite_number(size) and finite_number(patch)):
            return []
        if patch < 1 or not size % patch:
            return []
        return [
            f"{prefix}.patch_size={patch}: does not divide {prefix}.image_size={size}; choose a patch size that "
            f"divides the image size (e.g. {next(p for p in range(patch, 0, -1) if size % p == 0)})"
        ]

    embed_roles = (
        writer("embed.pos", 1),
        writer("embed.patch_w", 0),
        writer("embed.patch_b", 0),
        writer("embed.cls", 0),
    )
    head_roles = linear_head()

    def build(self, cfg) -> ViTForImageClassification:
        config = ViTConfig(
            image_size=cfg.image_size,
            patch_size=cfg.patch_size,
            num_channels=cfg.num_channels,
            **encoder_sizes(cfg),
            layer_norm_eps=cfg.layer_norm_eps,
            qkv_bias=cfg.qkv_bias,
            num_labels=cfg.num_labels,
        )
        return ViTForImageClassification(config)

    to_canonical = staticmethod(vit_to_canonical)
    to_hf = staticmethod(vit_from_canonical)

    def embed(self, config: CanonicalConfig, p: dict[str, Tensor], inputs: Tensor) -> Tensor:
        x = F.conv2d(inputs, p["embed.patch_w"], p["embed.patch_b"], stride=config.patch_size)
        x = x.flatten(2).transpose(1, 2)  # (B, patches, D)
        cls = p["embed.cls"].expand(x.shape[0], 1, -1)
        x = torch.cat([cls, x], dim=1)
        if x.shape[1] != p["embed.pos"].shape[0]:
            raise ValueError(f"{x.shape[1]} tokens for {p['embed.pos'].shape[0]} positions: wrong image size")
        return x + p["embed.pos"]

    def input_limits(self, params) -> dict[str, Any]:
        return {"classes": params["head.w"].shape[0]}

    def hf_input_limits(self, hf_config) -> dict[str, Any]:
        return {"classes": hf_config.num_labels}

    def input_properties(self, config, params):
        yield "has {} positions", params["embed.pos"].shape[0]
        yield "has patch size {}", config.patch_size
        yield "has {} input channels", config.num_channels
        yield "has {} classes", params["head.w"].shape[0]


FAMILY = ViTFamily()
