"""The Qwen3 family: Hugging Face Qwen3ForCausalLM <-> canonical Transformer, through the Llama conversion.

Llama's layout with an RMSNorm on each head's queries and keys before rotary (blocks.qk_norm): q_norm and
k_norm hold those gains, the 1/sqrt(head_dim) scale folded into q_norm (a norm follows q_w, so the scale
cannot sit there). The block keeps no per-head query/key maps, so the group is Llama's without the qk
spaces. Sliding windows convert as Qwen2's do (layer_types).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn
from transformers import Qwen3Config, Qwen3ForCausalLM

from glmc.models.export import set_param
from glmc.models.families.llama import LlamaFamily


class QueryKeyNormHooks:
    """The Llama conversion's hooks for per-head query/key norms (HF q_norm, k_norm; gains norm_offset + w),
    the attention's scaling folded into the query gain: shared by Qwen3 and Gemma 3."""

    norm_offset: float

    def query_scale(self, attn: nn.Module) -> float:
        return 1.0

    def head_norms(self, attn: nn.Module, g) -> dict[str, Tensor]:
        q_gain, k_gain = self.norm_offset + g(attn.q_norm.weight), self.norm_offset + g(attn.k_norm.weight)
        return {"q_norm": attn.scaling * q_gain, "k_norm": k_gain}

    def set_head_norms(self, attn: nn.Module, p, pre: str) -> None:
        set_param(attn.q_norm.weight, p(pre + "q_norm") / attn.scaling - self.norm_offset, pre + "q_norm")
        set_param(attn.k_norm.weight, p(pre + "k_norm") - self.norm_offset, pre + "k_norm")


class Qwen3Family(QueryKeyNormHooks, LlamaFamily):
    name = "qwen3"
    model_types = ("qwen3",)
    hf_classes = ("Qwen3ForCausalLM",)
    attention_kind = "qk_norm"
    config_class: Any = Qwen3Config
    model_class: Any = Qwen3ForCausalLM


FAMILY = Qwen3Family()
