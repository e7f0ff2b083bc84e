"""The OPT family: Hugging Face OPTForCausalLM <-> canonical Transformer.

GPT-2's block with nn.Linear layers, folded the same way (fold.py); the post-LN layout and projected word
embeddings (opt-350m) are refused. Learned positions read row t + 2 at position t (rows 0 and 1 serve
padding only): embed.pos holds rows 2 .. T + 1. The head, tied to the token embedding in OPT, is untied
here (head.w, head.b with the final LayerNorm folded in).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from transformers import OPTConfig, OPTForCausalLM

from glmc.models.canonical import CanonicalConfig, CanonicalTransformer
from glmc.models.export import check_heads, check_model, check_template, fresh, head_bias_offset, set_linear, set_param
from glmc.models.families.fold import StoredAs, bias64, center, common_eps, fold_block, fold_norm
from glmc.models.families.gpt2 import GPT2Family

# OPTLearnedPositionalEmbedding's offset: position t reads row t + 2
POSITION_OFFSET = 2
# OPT's LayerNorms are torch's defaults: OPTConfig has no setting for their eps
LAYER_NORM_EPS = 1e-5


def check_supported(cfg: Any) -> None:
    if not cfg.do_layer_norm_before:
        raise NotImplementedError(
            "OPT with do_layer_norm_before=False (post-LN, as opt-350m): only the pre-LN layout converts"
        )
    if cfg.word_embed_proj_dim != cfg.hidden_size:
        raise NotImplementedError(
            f"OPT with word_embed_proj_dim={cfg.word_embed_proj_dim} != hidden_size={cfg.hidden_size} (projected "
            "word embeddings, as opt-350m): only word_embed_proj_dim == hidden_size converts"
        )
    if getattr(cfg, "_remove_final_layer_norm", False):
        raise NotImplementedError(
            "OPT with _remove_final_layer_norm=True: the canonical head reads a normalised stream"
        )


def _affine(norm: nn.LayerNorm, width: int, g, device: torch.device) -> tuple[Tensor, Tensor]:
    """A LayerNorm's gain and offset (1 and 0 on `device`, the model's, where layer_norm_elementwise_affine=False)."""
    if norm.weight is None:
        ones = torch.ones(width, dtype=torch.float64, device=device)
        return ones, torch.zeros_like(ones)
    return g(norm.weight), g(norm.bias)


@torch.no_grad()
def opt_to_canonical(model: OPTForCausalLM) -> CanonicalTransformer:
    cfg, dec = model.config, model.model.decoder
    check_supported(cfg)
    dtype, device = dec.embed_tokens.weight.dtype, dec.embed_tokens.weight.device
    g = lambda t: t.detach().double()  # noqa: E731  fold in float64, cast back per tensor (StoredAs)
    D = cfg.hidden_size

    p = StoredAs(
        dtype,
        {
            "embed.tokens": center(g(dec.embed_tokens.weight), 1),
            "embed.pos": center(g(dec.embed_positions.weight)[POSITION_OFFSET:], 1),
        },
    )
    linear = lambda m: (g(m.weight), bias64(m, m.out_features))  # noqa: E731
    for i, layer in enumerate(dec.layers):
        attn = layer.self_attn
        qkv = [(*linear(lin), s) for lin, s in ((attn.q_proj, attn.scaling), (attn.k_proj, 1.0), (attn.v_proj, 1.0))]
        norms = _affine(layer.self_attn_layer_norm, D, g, device), _affine(layer.final_layer_norm, D, g, device)
        o, mlp = linear(attn.out_proj), (linear(layer.fc1), linear(layer.fc2))
        p |= fold_block(f"blocks.{i}.", attn.num_heads, norms[0], qkv, o, norms[1], *mlp)
    p["head.w"], p["head.b"] = fold_norm(g(model.lm_head.weight), None, *_affine(dec.final_layer_norm, D, g, device))

    norms = [dec.final_layer_norm] + [
        n for layer in dec.layers for n in (layer.self_attn_layer_norm, layer.final_layer_norm)
    ]
    config = CanonicalConfig(
        family="opt",
        activation=cfg.activation_function,
        norm_eps=common_eps(norms),
        norm_dim=D,
        causal=True,
        pooling="none",
    )
    return CanonicalTransformer(config, dict(p), copy=False)


def _check_template(model: CanonicalTransformer, template: OPTForCausalLM) -> None:
    cfg = template.config
    check_supported(cfg)
    check_template(model, cfg.activation_function, "hidden_size", cfg.hidden_size)
    if model.config.norm_eps != LAYER_NORM_EPS:
        raise ValueError(
            f"the model's norm epsilon is {model.config.norm_eps}, but an OPT LayerNorm's is {LAYER_NORM_EPS} "
            "(OPTConfig has no setting for it)"
        )
    check_heads(model, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads)


def _identity(norm: nn.LayerNorm, offset: Tensor | None = None) -> None:
    """Gain 1 and this offset (0 by default); a LayerNorm without an affine map takes a zero offset only."""
    if norm.weight is not None:
        norm.weight.fill_(1.0)
        norm.bias.copy_(torch.zeros_like(norm.bias) if offset is None else offset.to(norm.bias.dtype))
    elif offset is not None and offset.abs().max() > 1e-6:
        raise ValueError(
            "head.b needs the final LayerNorm's offset, but the template has layer_norm_elementwise_affine=False"
        )


def opt_from_canonical(model: CanonicalTransformer, template: OPTForCausalLM) -> OPTForCausalLM:
    params = check_model(model, "opt")
    p = lambda n: params[n].double()  # noqa: E731
    _check_template(model, template)
    beta = head_bias_offset(p("head.w"), p("head.b"), "opt")
    # head.w differs from the token embedding (folding, merging): the head must not be tied
    hf = fresh(template, tie_word_embeddings=False)
    dec, D = hf.model.decoder, model.width
    set_param(dec.embed_tokens.weight, p("embed.tokens"), "embed.tokens")
    positions = dec.embed_positions.weight
    set_param(positions[POSITION_OFFSET:], p("embed.pos"), "embed.pos")
    positions[:POSITION_OFFSET].zero_()
    for i, layer in enumerate(dec.layers):
        attn, pre = layer.self_attn, f"blocks.{i}."
        _identity(layer.self_attn_layer_norm)
        _identity(layer.final_layer_norm)
        for name, lin, scale in (("q", attn.q_proj, attn.scaling), ("k", attn.k_proj, 1.0), ("v", attn.v_proj, 1.0)):
            weight, bias = p(pre + name + "_w").reshape(D, D) / scale, p(pre + name + "_b").flatten() / scale
            set_linear(lin, weight, bias, pre + name, "enable_bias")
        o_w = p(pre + "o_w").permute(1, 0, 2).flatten(1)
        set_linear(attn.out_proj, o_w, p(pre + "o_b"), pre + "o", "enable_bias")
        set_linear(layer.fc1, p(pre + "in_w"), p(pre + "in_b"), pre + "in", "enable_bias")
        set_linear(layer.fc2, p(pre + "out_w"), p(pre + "out_b"), pre + "out", "enable_bias")
    _identity(dec.final_layer_norm, beta)
    if hf.lm_head.weight is dec.embed_tokens.weight:
        raise ValueError("the exported OPT still ties lm_head to embed_tokens: cannot write a separate head")
    set_param(hf.lm_head.weight, p("head.w"), "head.w")
    return hf


class OPTFamily(GPT2Family):
    """GPT-2's embedding, head and input limits; OPT's own build and conversion."""

    name = "opt"
    model_types = ("opt",)
    hf_classes = ("OPTForCausalLM",)
    fixed_model_values = {"layer_norm_eps": LAYER_NORM_EPS}

    def build(self, cfg: Any) -> OPTForCausalLM:
        if cfg.layer_norm_eps != LAYER_NORM_EPS:
            raise ValueError(
                f"model.layer_norm_eps={cfg.layer_norm_eps}: OPT's LayerNorms have eps {LAYER_NORM_EPS}, which "
                f"OPTConfig cannot change; set model.layer_norm_eps={LAYER_NORM_EPS}"
            )
        config = OPTConfig(
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.hidden_size,
            num_hidden_layers=cfg.num_layers,
            ffn_dim=cfg.mlp_size,
            max_position_embeddings=cfg.max_positions,
            do_layer_norm_before=True,
            word_embed_proj_dim=cfg.hidden_size,
            dropout=cfg.dropout,
            attention_dropout=cfg.dropout,
            num_attention_heads=cfg.num_heads,
            activation_function=cfg.hidden_act,
            # a character vocabulary has no special ids; a padding id would also freeze its embedding row
            pad_token_id=None,
            bos_token_id=None,
            eos_token_id=None,
        )
        return OPTForCausalLM(config)

    to_canonical = staticmethod(opt_to_canonical)
    to_hf = staticmethod(opt_from_canonical)

    def hf_input_limits(self, hf_config) -> dict[str, Any]:
        return {"positions": hf_config.max_position_embeddings, "vocab": hf_config.vocab_size}


FAMILY = OPTFamily()
