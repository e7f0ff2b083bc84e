"""The GPT-2 family: Hugging Face GPT2LMHeadModel <-> canonical Transformer.

Canonical embedding tensors: embed.tokens (V, D), embed.pos (T, D); head.w (V, D), head.b (V), the
untied unembedding with ln_f folded in, read at every position.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from transformers import GPT2Config, GPT2LMHeadModel

from glmc.models.canonical import CanonicalConfig, CanonicalTransformer
from glmc.models.export import check_model, check_template, fresh, head_bias_offset, identity_norm, set_param
from glmc.models.families.base import Family
from glmc.models.families.fold import StoredAs, center, common_eps, fold_block, fold_norm, weights64
from glmc.models.families.roles import linear_head, writer


@torch.no_grad()
def gpt2_to_canonical(model: GPT2LMHeadModel) -> CanonicalTransformer:
    tr, cfg = model.transformer, model.config
    if cfg.add_cross_attention:
        raise NotImplementedError("GPT-2 with cross-attention")
    dtype = tr.wte.weight.dtype
    g = lambda t: t.detach().double()  # noqa: E731  fold in float64, cast back per tensor (StoredAs)
    D = cfg.n_embd

    # the token embedding is centred as a writer; the (tied) unembedding is folded separately below
    p = StoredAs(dtype, {"embed.tokens": center(g(tr.wte.weight), 1), "embed.pos": center(g(tr.wpe.weight), 1)})
    conv = lambda m: (g(m.weight).T, g(m.bias))  # noqa: E731  Conv1D weights are (in, out)
    for i, block in enumerate(tr.h):
        attn = block.attn
        w, b = conv(attn.c_attn)  # c_attn packs Q, K, V along its output axis
        qkv = [(w[j * D : (j + 1) * D], b[j * D : (j + 1) * D], s) for j, s in enumerate((attn.scaling, 1.0, 1.0))]
        norms = weights64(block.ln_1), weights64(block.ln_2)
        mlp = conv(block.mlp.c_fc), conv(block.mlp.c_proj)
        p |= fold_block(f"blocks.{i}.", attn.num_heads, norms[0], qkv, conv(attn.c_proj), norms[1], *mlp)
    head_b = None if model.lm_head.bias is None else g(model.lm_head.bias)
    p["head.w"], p["head.b"] = fold_norm(g(model.lm_head.weight), head_b, *weights64(tr.ln_f))

    config = CanonicalConfig(
        family="gpt2",
        activation=cfg.activation_function,
        norm_eps=common_eps([tr.ln_f] + [n for b in tr.h for n in (b.ln_1, b.ln_2)]),
        norm_dim=D,
        causal=True,
        pooling="none",
    )
    return CanonicalTransformer(config, dict(p), copy=False)


def gpt2_from_canonical(model: CanonicalTransformer, template: GPT2LMHeadModel) -> GPT2LMHeadModel:
    params = check_model(model, "gpt2")
    p = lambda n: params[n].double()  # noqa: E731
    cfg = template.config
    check_template(
        model, cfg.activation_function, "n_embd", cfg.n_embd, (cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head)
    )
    beta = head_bias_offset(p("head.w"), p("head.b"), "gpt2")
    # head.w differs from the token embedding (folding, merging): the head must not be tied
    hf = fresh(template, layer_norm_epsilon=model.config.norm_eps, tie_word_embeddings=False)
    tr, D = hf.transformer, model.width
    set_param(tr.wte.weight, p("embed.tokens"), "embed.tokens")
    set_param(tr.wpe.weight, p("embed.pos"), "embed.pos")
    for i, block in enumerate(tr.h):
        attn, pre = block.attn, f"blocks.{i}."
        identity_norm(block.ln_1)
        identity_norm(block.ln_2)
        # Conv1D weights are (in, out); c_attn packs Q, K, V along its output axis
        scales = (attn.scaling, 1.0, 1.0)
        w = torch.cat([p(pre + n + "_w").reshape(D, D) / s for n, s in zip("qkv", scales)], 0)
        b = torch.cat([p(pre + n + "_b").flatten() / s for n, s in zip("qkv", scales)], 0)
        set_param(attn.c_attn.weight, w.T, pre + "q_w, k_w, v_w")
        set_param(attn.c_attn.bias, b, pre + "q_b, k_b, v_b")
        set_param(attn.c_proj.weight, p(pre + "o_w").permute(1, 0, 2).flatten(1).T, pre + "o_w")
        set_param(attn.c_proj.bias, p(pre + "o_b"), pre + "o_b")
        set_param(block.mlp.c_fc.weight, p(pre + "in_w").T, pre + "in_w")
        set_param(block.mlp.c_fc.bias, p(pre + "in_b"), pre + "in_b")
        set_param(block.mlp.c_proj.weight, p(pre + "out_w").T, pre + "out_w")
        set_param(block.mlp.c_proj.bias, p(pre + "out_b"), pre + "out_b")
    tr.ln_f.weight.fill_(1.0)
    tr.ln_f.bias.copy_(beta.to(tr.ln_f.bias.dtype))
    if hf.lm_head.weight is tr.wte.weight:
        raise ValueError("the exported GPT-2 still ties lm_head to wte: cannot write a separate head")
    set_param(hf.lm_head.weight, p("head.w"), "head.w")
    return hf


class GPT2Family(Family):
    name = "gpt2"
    model_types = ("gpt2",)
    hf_classes = ("GPT2LMHeadModel",)
    data_kind = "text"
    tasks = ("causal_lm",)
    shared_model_keys = ("vocab_size", "max_positions")
    model_keys = ("vocab_size", "max_positions")
    embed_roles = (writer("embed.pos"), writer("embed.tokens", vocab_rows=True))
    head_roles = linear_head(vocab_rows=True)

    def build(self, cfg) -> GPT2LMHeadModel:
        config = GPT2Config(
            vocab_size=cfg.vocab_size,
            n_positions=cfg.max_positions,
            n_embd=cfg.hidden_size,
            n_layer=cfg.num_layers,
            n_head=cfg.num_heads,
            n_inner=cfg.mlp_size,
            activation_function=cfg.hidden_act,
            resid_pdrop=cfg.dropout,
            embd_pdrop=cfg.dropout,
            attn_pdrop=cfg.dropout,
            layer_norm_epsilon=cfg.layer_norm_eps,
            # GPT-2's BOS/EOS id 50256 exists only in its own vocabulary; a character vocabulary has none
            bos_token_id=50256 if cfg.vocab_size > 50256 else None,
            eos_token_id=50256 if cfg.vocab_size > 50256 else None,
        )
        return GPT2LMHeadModel(config)

    to_canonical = staticmethod(gpt2_to_canonical)
    to_hf = staticmethod(gpt2_from_canonical)

    def embed(self, config: CanonicalConfig, p: dict[str, Tensor], inputs: Tensor) -> Tensor:
        x = p["embed.tokens"][inputs]
        return x + p["embed.pos"][: x.shape[1]]

    def input_limits(self, params) -> dict[str, Any]:
        return {"positions": params["embed.pos"].shape[0], "vocab": params["embed.tokens"].shape[0]}

    def hf_input_limits(self, hf_config) -> dict[str, Any]:
        return {"positions": hf_config.n_positions, "vocab": hf_config.vocab_size}

    def input_properties(self, config, params):
        yield "has {} positions", params["embed.pos"].shape[0]
        yield "has a vocabulary of {} tokens", params["embed.tokens"].shape[0]
        yield "has {} classes", params["head.w"].shape[0]


FAMILY = GPT2Family()
