"""Exact conversion of Hugging Face GPT2LMHeadModel to the canonical Transformer."""

import torch
from transformers import GPT2LMHeadModel

from glmc.models.canonical import CanonicalConfig, CanonicalTransformer
from glmc.models.fold import center, common_eps, fold_norm


@torch.no_grad()
def gpt2_to_canonical(model: GPT2LMHeadModel) -> CanonicalTransformer:
    if not isinstance(model, GPT2LMHeadModel):
        raise TypeError(f"expected GPT2LMHeadModel, got {type(model).__name__}")
    tr, cfg = model.transformer, model.config
    if cfg.add_cross_attention:
        raise NotImplementedError("GPT-2 with cross-attention")
    dtype = tr.wte.weight.dtype
    g = lambda t: t.detach().double()  # noqa: E731  fold in float64, cast back at the end
    D = cfg.n_embd

    # the token embedding is centred as a writer; the (tied) unembedding is folded separately below
    p = {"embed.tokens": center(g(tr.wte.weight), 1), "embed.pos": center(g(tr.wpe.weight), 1)}
    for i, block in enumerate(tr.h):
        attn, pre = block.attn, f"blocks.{i}."
        H, dh = attn.num_heads, attn.head_dim
        # Conv1D weights are (in, out); c_attn packs Q, K, V along its output axis
        w_qkv, b_qkv = g(attn.c_attn.weight).T, g(attn.c_attn.bias)
        gamma, beta = g(block.ln_1.weight), g(block.ln_1.bias)
        for j, (name, scale) in enumerate((("q", attn.scaling), ("k", 1.0), ("v", 1.0))):
            rows = slice(j * D, (j + 1) * D)
            w, b = fold_norm(w_qkv[rows], b_qkv[rows], gamma, beta)
            p[pre + name + "_w"] = (scale * w).reshape(H, dh, D)
            p[pre + name + "_b"] = (scale * b).reshape(H, dh)
        p[pre + "o_w"] = center(g(attn.c_proj.weight).T, 0).reshape(D, H, dh).permute(1, 0, 2)
        p[pre + "o_b"] = center(g(attn.c_proj.bias), 0)
        gamma, beta = g(block.ln_2.weight), g(block.ln_2.bias)
        p[pre + "in_w"], p[pre + "in_b"] = fold_norm(g(block.mlp.c_fc.weight).T, g(block.mlp.c_fc.bias), gamma, beta)
        p[pre + "out_w"] = center(g(block.mlp.c_proj.weight).T, 0)
        p[pre + "out_b"] = center(g(block.mlp.c_proj.bias), 0)
    head_b = None if model.lm_head.bias is None else g(model.lm_head.bias)
    p["head.w"], p["head.b"] = fold_norm(g(model.lm_head.weight), head_b, g(tr.ln_f.weight), g(tr.ln_f.bias))

    config = CanonicalConfig(
        family="gpt2",
        activation=cfg.activation_function,
        norm_eps=common_eps([tr.ln_f] + [n for b in tr.h for n in (b.ln_1, b.ln_2)]),
        norm_dim=D,
        causal=True,
        pooling="none",
    )
    return CanonicalTransformer(config, {k: v.to(dtype).contiguous() for k, v in p.items()})
