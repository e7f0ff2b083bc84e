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

from torch import nn
from transformers import GemmaConfig, GemmaForCausalLM

from glmc.models.families.llama import LlamaFamily


class GemmaFamily(LlamaFamily):
    name = "gemma"
    model_types = ("gemma",)
    hf_classes = ("GemmaForCausalLM",)
    norm_offset = 1.0
    # GemmaConfig turns hidden_act "gelu" into its tanh approximation, which the canonical model then reads
    config_class = GemmaConfig
    model_class = GemmaForCausalLM

    def embed_scale(self, inner: nn.Module) -> float:
        # the normaliser is a float32 buffer cast to the weights' dtype before the product
        embed = inner.embed_tokens
        return float(embed.embed_scale.to(embed.weight.dtype))


FAMILY = GemmaFamily()
