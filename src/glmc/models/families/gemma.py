"""The Gemma family: Hugging Face GemmaForCausalLM <-> canonical Transformer, through the Llama conversion.

Its RMSNorm multiplies by (1 + w) and its token embeddings by sqrt(hidden_size) (rounded to the weights'
dtype, folded into embed.tokens); the MLP is GeGLU; the head, tied by default, is untied here.
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
