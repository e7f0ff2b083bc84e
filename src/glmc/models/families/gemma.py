"""The Gemma family: Hugging Face GemmaForCausalLM <-> canonical Transformer.

Gemma is the Llama block (llama.py: RMSNorm, rotary positions, grouped-query attention, gated MLP) with
three details the Llama conversion takes from this family: its RMSNorm multiplies by (1 + w), so the
stored weight w is the gain less one (the gain 1 + w folds into the readers); the token embeddings are
multiplied by sqrt(hidden_size), rounded to the weights' dtype as Hugging Face does (folded into
embed.tokens); and the MLP is GeGLU, the tanh approximation of GELU on the gate. Its head_dim is a
setting of its own (not hidden_size / heads), which the canonical shapes carry. The head is tied to the
token embedding by default; the canonical head.w is untied (the embedding times the final norm's gain),
and an export writes an untied model.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from transformers import GemmaConfig, GemmaForCausalLM

from glmc.models.families.llama import LlamaFamily


class GemmaFamily(LlamaFamily):
    name = "gemma"
    model_types = ("gemma",)
    hf_classes = ("GemmaForCausalLM",)
    norm_offset = 1.0

    def embed_scale(self, inner: nn.Module) -> float:
        # the normaliser is a float32 buffer cast to the weights' dtype before the product
        embed = inner.embed_tokens
        return float(embed.embed_scale.to(embed.weight.dtype))

    def build(self, cfg: Any) -> GemmaForCausalLM:
        kv_heads = cfg.num_kv_heads or cfg.num_heads
        if cfg.num_heads % kv_heads:
            raise ValueError(f"model.num_heads={cfg.num_heads} is not a multiple of model.num_kv_heads={kv_heads}")
        config = GemmaConfig(
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.hidden_size,
            intermediate_size=cfg.mlp_size,
            num_hidden_layers=cfg.num_layers,
            num_attention_heads=cfg.num_heads,
            num_key_value_heads=kv_heads,
            head_dim=cfg.hidden_size // cfg.num_heads,
            # GemmaConfig turns "gelu" into its tanh approximation, which the canonical model then reads
            hidden_act=cfg.hidden_act,
            max_position_embeddings=cfg.max_positions,
            rms_norm_eps=cfg.layer_norm_eps,
            tie_word_embeddings=cfg.tie_embeddings,
            rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
            attention_dropout=cfg.dropout,
            # a character vocabulary has no special ids; a padding id would also freeze its embedding row
            pad_token_id=None,
            bos_token_id=None,
            eos_token_id=None,
        )
        return GemmaForCausalLM(config)


FAMILY = GemmaFamily()
