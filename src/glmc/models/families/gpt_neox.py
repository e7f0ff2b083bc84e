"""The GPT-NeoX family (Pythia): Hugging Face GPTNeoXForCausalLM <-> canonical Transformer.

LayerNorms fold as GPT-2's do (fold.py); the fused query_key_value rows are (head, [q, k, v], dim);
rotary positions on the first int(head_dim * partial_rotary_factor) dims (an odd count rotates one more,
CanonicalConfig.rotary_dims and rotary_freq_dim); a plain MLP; a parallel or sequential residual. The
canonical block is grouped-query attention with one query head per key/value head (blocks.grouped).
Embedding and head: embed.tokens (V, D); head.w (V, D), head.b (V), final_layer_norm folded in (an
export moves head.b back into that norm's offset).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

from glmc.models.canonical import CanonicalConfig, CanonicalTransformer
from glmc.models.export import check_model, check_template, fresh, head_bias_offset, identity_norm, set_param
from glmc.models.families.base import TokenRotaryFamily, layer_sizes
from glmc.models.families.fold import StoredAs, bias64, by_rows, center, common_eps, fold_norm
from glmc.models.families.llama import rope_scaling, rope_theta
from glmc.models.families.roles import linear_head
from glmc.models.rotary import rotating_dims

QKV = ("q", "k", "v")


def rotary_dims(cfg: Any) -> int:
    """int(head_dim * partial_rotary_factor), as Hugging Face computes it; ValueError where an odd count
    would rotate one dim more than the head has."""
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    factor = (getattr(cfg, "rope_parameters", None) or {}).get("partial_rotary_factor", 1.0)
    return _checked_rotary(int(head_dim * factor), head_dim, f"partial_rotary_factor={factor}")


def _checked_rotary(dims: int, head_dim: int, setting: str) -> int:
    if rotating_dims(dims) > head_dim:
        raise ValueError(
            f"{setting} rotates {dims} dims of each head of {head_dim}: an odd count rotates one dim more, which "
            "the head does not have; use an even head size or a smaller rotary share"
        )
    return dims


def _canonical_rotary(dims: int, head_dim: int) -> dict[str, int | None]:
    """CanonicalConfig's rotary_dims and rotary_freq_dim for Hugging Face's count `dims` of `head_dim`."""
    rotating = rotating_dims(dims)
    return {
        "rotary_dims": None if rotating == head_dim else rotating,
        "rotary_freq_dim": dims if dims % 2 else None,
    }


def _hf_rotary_dims(c: CanonicalConfig) -> int:
    """Hugging Face's int(head_dim * rotary_pct) of a canonical config (what _canonical_rotary wrote)."""
    if c.rotary_freq_dim is not None:
        return c.rotary_freq_dim
    return c.rope_dim if c.rotary_dims is None else c.rotary_dims


def _attention(layer: nn.Module, pre: str, heads: int) -> dict[str, Tensor]:
    """One block's attention tensors, input_layernorm folded into q, k and v (float64)."""
    attn, g = layer.attention, lambda t: t.detach().double()  # noqa: E731
    dh, D = attn.head_size, attn.query_key_value.in_features
    # the fused output rows are (head, [q, k, v], dim)
    w = g(attn.query_key_value.weight).reshape(heads, 3, dh, D)
    b = bias64(attn.query_key_value, 3 * heads * dh).reshape(heads, 3, dh)
    gamma, beta = g(layer.input_layernorm.weight), g(layer.input_layernorm.bias)
    p = {}
    for j, name in enumerate(QKV):
        scale, shape = (attn.scaling, (heads, 1, dh)) if name == "q" else (1.0, (heads, dh))
        wj, bj = fold_norm(w[:, j].reshape(heads * dh, D), b[:, j].flatten(), gamma, beta)
        p[pre + name + "_w"], p[pre + name + "_b"] = (scale * wj).reshape(*shape, D), (scale * bj).reshape(shape)
    # dense weight (D, H * dh): column block h is head h
    p[pre + "o_w"] = center(g(attn.dense.weight), 0).reshape(D, heads, 1, dh).permute(1, 2, 0, 3)
    p[pre + "o_b"] = center(bias64(attn.dense, D), 0)
    return p


def _mlp(layer: nn.Module, pre: str) -> dict[str, Tensor]:
    """One block's MLP tensors, post_attention_layernorm folded into the first layer (float64)."""
    mlp, g = layer.mlp, lambda t: t.detach().double()  # noqa: E731
    norm = layer.post_attention_layernorm
    units = mlp.dense_h_to_4h.out_features
    p = {}
    p[pre + "in_w"], p[pre + "in_b"] = fold_norm(
        g(mlp.dense_h_to_4h.weight), bias64(mlp.dense_h_to_4h, units), g(norm.weight), g(norm.bias)
    )
    p[pre + "out_w"] = center(g(mlp.dense_4h_to_h.weight), 0)
    p[pre + "out_b"] = center(bias64(mlp.dense_4h_to_h, mlp.dense_4h_to_h.out_features), 0)
    return p


@torch.no_grad()
def gpt_neox_to_canonical(model: GPTNeoXForCausalLM) -> CanonicalTransformer:
    cfg, inner = model.config, model.gpt_neox
    dtype = inner.embed_in.weight.dtype
    g = lambda t: t.detach().double()  # noqa: E731  fold in float64, cast back per tensor (StoredAs)
    p = StoredAs(dtype, {"embed.tokens": by_rows(lambda w: center(w, 1), inner.embed_in.weight, dtype)})
    for i, layer in enumerate(inner.layers):
        p.update(_attention(layer, f"blocks.{i}.", cfg.num_attention_heads))
        p.update(_mlp(layer, f"blocks.{i}."))
    head, final = model.get_output_embeddings(), inner.final_layer_norm
    # fold_norm a chunk of the vocabulary's rows at a time
    gamma, beta = g(final.weight), g(final.bias)
    p["head.w"] = by_rows(lambda w: w * gamma, head.weight, dtype)
    offset = by_rows(lambda w: w @ beta, head.weight, torch.float64)
    p["head.b"] = offset if head.bias is None else g(head.bias) + offset

    head_dim, rotary = cfg.hidden_size // cfg.num_attention_heads, rotary_dims(cfg)
    config = CanonicalConfig(
        family="gpt_neox",
        activation=cfg.hidden_act,
        norm_eps=common_eps(
            [final] + [n for b in inner.layers for n in (b.input_layernorm, b.post_attention_layernorm)]
        ),
        norm_dim=cfg.hidden_size,
        causal=True,
        pooling="none",
        rope_theta=rope_theta(cfg),
        rope_dim=head_dim,
        **_canonical_rotary(rotary, head_dim),
        rope_scaling=rope_scaling(cfg),
        parallel_residual=bool(cfg.use_parallel_residual),
    )
    return CanonicalTransformer(config, dict(p), copy=False)


def _set_linear(linear: nn.Linear, weight: Tensor, bias: Tensor, name: str) -> None:
    set_param(linear.weight, weight, name + " weights")
    if linear.bias is not None:
        set_param(linear.bias, bias, name + " biases")
    elif bias.abs().max() > 1e-6 * weight.abs().max():
        raise ValueError(f"{name} biases are not zero but the template's layer has none: set attention_bias=True")


def _check_template(model: CanonicalTransformer, cfg: Any) -> None:
    """ValueError naming the first setting in which the template cannot hold the model."""
    c = model.config
    heads = (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads)
    check_template(model, cfg.hidden_act, "hidden_size", cfg.hidden_size, heads)
    sizes = layer_sizes(FAMILY.layout(c), model.params(), model.num_layers)
    if set(sizes["qheads"]) != {1}:
        raise ValueError(f"query heads per key/value head {sizes['qheads']}: a GPT-NeoX head has its own keys")
    template = {
        "rotary base": rope_theta(cfg),
        "rotary dims per head": rotary_dims(cfg),
        "rotary scaling": rope_scaling(cfg),
        "parallel residual": bool(cfg.use_parallel_residual),
    }
    own = (c.rope_theta, _hf_rotary_dims(c), c.rope_scaling, c.parallel_residual)
    for (what, theirs), mine in zip(template.items(), own):
        if theirs != mine:
            raise ValueError(f"the template's {what} {theirs} is not the model's {mine}")


def _write_block(layer: nn.Module, p, pre: str, width: int) -> None:
    attn, mlp = layer.attention, layer.mlp
    scale = {"q": attn.scaling, "k": 1.0, "v": 1.0}
    # per head the rows [q_h; k_h; v_h], q with the attention scale divided back out
    w = torch.stack([p(pre + n + "_w").reshape(-1, attn.head_size, width) / scale[n] for n in QKV], 1)
    b = torch.stack([p(pre + n + "_b").reshape(-1, attn.head_size) / scale[n] for n in QKV], 1)
    _set_linear(attn.query_key_value, w.reshape(-1, width), b.flatten(), pre + "q, k, v")
    _set_linear(attn.dense, p(pre + "o_w").permute(2, 0, 1, 3).reshape(width, -1), p(pre + "o_b"), pre + "o")
    identity_norm(layer.input_layernorm)
    identity_norm(layer.post_attention_layernorm)
    _set_linear(mlp.dense_h_to_4h, p(pre + "in_w"), p(pre + "in_b"), pre + "in")
    _set_linear(mlp.dense_4h_to_h, p(pre + "out_w"), p(pre + "out_b"), pre + "out")


@torch.no_grad()
def gpt_neox_from_canonical(model: CanonicalTransformer, template: GPTNeoXForCausalLM) -> GPTNeoXForCausalLM:
    params = check_model(model, "gpt_neox")
    p = lambda n: params[n].double()  # noqa: E731
    _check_template(model, template.config)
    beta = head_bias_offset(p("head.w"), p("head.b"), "gpt_neox")
    hf = fresh(template, layer_norm_eps=model.config.norm_eps, tie_word_embeddings=False)
    inner = hf.gpt_neox
    set_param(inner.embed_in.weight, p("embed.tokens"), "embed.tokens")
    for i, layer in enumerate(inner.layers):
        _write_block(layer, p, f"blocks.{i}.", model.width)
    inner.final_layer_norm.weight.fill_(1.0)
    inner.final_layer_norm.bias.copy_(beta.to(inner.final_layer_norm.bias.dtype))
    head = hf.get_output_embeddings()
    if head.weight is inner.embed_in.weight:
        raise ValueError("the exported model still ties its unembedding to embed_in: cannot write a separate head")
    set_param(head.weight, p("head.w"), "head.w")
    return hf


class GPTNeoXFamily(TokenRotaryFamily):
    name = "gpt_neox"
    model_types = ("gpt_neox",)
    hf_classes = ("GPTNeoXForCausalLM",)
    shared_model_keys = ("vocab_size", "max_positions", "rope_theta", "rotary_pct", "parallel_residual")
    own_model_keys = ("rotary_pct", "parallel_residual")
    model_keys = ("vocab_size", "max_positions", "rope_theta", "rotary_pct", "parallel_residual")
    head_roles = linear_head(vocab_rows=True)

    def build(self, cfg) -> GPTNeoXForCausalLM:
        head_dim = cfg.hidden_size // cfg.num_heads
        _checked_rotary(int(head_dim * cfg.rotary_pct), head_dim, f"model.rotary_pct={cfg.rotary_pct}")
        config = GPTNeoXConfig(
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.hidden_size,
            num_hidden_layers=cfg.num_layers,
            num_attention_heads=cfg.num_heads,
            intermediate_size=cfg.mlp_size,
            hidden_act=cfg.hidden_act,
            max_position_embeddings=cfg.max_positions,
            layer_norm_eps=cfg.layer_norm_eps,
            use_parallel_residual=cfg.parallel_residual,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": cfg.rope_theta,
                "partial_rotary_factor": cfg.rotary_pct,
            },
            attention_dropout=cfg.dropout,
            hidden_dropout=cfg.dropout,
            tie_word_embeddings=False,
            # a character vocabulary has no BOS/EOS ids of its own
            bos_token_id=None,
            eos_token_id=None,
        )
        return GPTNeoXForCausalLM(config)

    to_canonical = staticmethod(gpt_neox_to_canonical)
    to_hf = staticmethod(gpt_neox_from_canonical)

    def input_properties(self, config, params):
        yield "has a vocabulary of {} tokens", params["embed.tokens"].shape[0]
        yield "has {} outputs", params["head.w"].shape[0]
        yield "has rotary base {}", config.rope_theta
        yield "rotates {} dims per head", _hf_rotary_dims(config)
        yield "has rotary scaling {}", config.rope_scaling
        yield "has parallel_residual={}", config.parallel_residual


FAMILY = GPTNeoXFamily()
