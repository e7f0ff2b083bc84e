"""Exact conversion of Hugging Face ViTForImageClassification to the canonical Transformer."""

import torch
from transformers import ViTForImageClassification

from glmc.models.canonical import CanonicalConfig, CanonicalTransformer
from glmc.models.fold import center, common_eps, fold_norm


@torch.no_grad()
def vit_to_canonical(model: ViTForImageClassification) -> CanonicalTransformer:
    if not isinstance(model, ViTForImageClassification):
        raise TypeError(f"expected ViTForImageClassification, got {type(model).__name__}")
    if not isinstance(model.classifier, torch.nn.Linear):
        raise ValueError("ViT without a linear classifier (num_labels=0) has no logits to convert")
    vit, cfg = model.vit, model.config
    dtype = model.classifier.weight.dtype
    g = lambda t: t.detach().double()  # noqa: E731  fold in float64, cast back at the end
    proj = vit.embeddings.patch_embeddings.projection
    if proj.stride[0] != proj.stride[1] or proj.kernel_size != proj.stride:
        raise NotImplementedError(f"non-square or overlapping patches {proj.kernel_size}, {proj.stride}")
    D = cfg.hidden_size

    p = {
        "embed.patch_w": center(g(proj.weight), 0),
        "embed.patch_b": center(g(proj.bias), 0),
        "embed.cls": center(g(vit.embeddings.cls_token).reshape(D), 0),
        "embed.pos": center(g(vit.embeddings.position_embeddings)[0], 1),
    }
    for i, layer in enumerate(vit.layers):
        attn, pre = layer.attention, f"blocks.{i}."
        H, dh = attn.num_attention_heads, attn.head_dim
        gamma, beta = g(layer.layernorm_before.weight), g(layer.layernorm_before.bias)
        for name, lin, scale in (("q", attn.q_proj, attn.scaling), ("k", attn.k_proj, 1.0), ("v", attn.v_proj, 1.0)):
            bias = None if lin.bias is None else g(lin.bias)
            w, b = fold_norm(g(lin.weight), bias, gamma, beta)
            p[pre + name + "_w"] = (scale * w).reshape(H, dh, D)
            p[pre + name + "_b"] = (scale * b).reshape(H, dh)
        # o_proj weight (D, H*dh): column block h belongs to head h
        p[pre + "o_w"] = center(g(attn.o_proj.weight), 0).reshape(D, H, dh).permute(1, 0, 2)
        p[pre + "o_b"] = center(g(attn.o_proj.bias), 0)
        gamma, beta = g(layer.layernorm_after.weight), g(layer.layernorm_after.bias)
        p[pre + "in_w"], p[pre + "in_b"] = fold_norm(g(layer.mlp.fc1.weight), g(layer.mlp.fc1.bias), gamma, beta)
        p[pre + "out_w"] = center(g(layer.mlp.fc2.weight), 0)
        p[pre + "out_b"] = center(g(layer.mlp.fc2.bias), 0)
    final = vit.layernorm
    head = model.classifier
    p["head.w"], p["head.b"] = fold_norm(g(head.weight), g(head.bias), g(final.weight), g(final.bias))

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
    return CanonicalTransformer(config, {k: v.to(dtype).contiguous() for k, v in p.items()})
