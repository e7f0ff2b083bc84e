"""The Qwen3-MoE family: Hugging Face Qwen3MoeForCausalLM <-> canonical Transformer, through the Llama
conversion.

Qwen3's attention (an RMSNorm on each head's queries and keys before rotary: blocks.qk_norm) with a mixture
of SwiGLU experts (blocks.moe, as Mixtral's), routing renormalised where norm_topk_prob says. The group is
Qwen3's without the gated MLP's spaces, with the experts' (expert order, each expert's units). Layers with
a dense MLP (mlp_only_layers, decoder_sparse_step > 1) are refused.
"""

from __future__ import annotations

from typing import Any

from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from glmc.models.families.qwen2_moe import SparseMoeFamily
from glmc.models.families.qwen3 import Qwen3Family


class Qwen3MoeFamily(SparseMoeFamily, Qwen3Family):
    """Mixtral's experts as Qwen2-MoE configures them (mlp_kind, the MLP hooks) on Qwen3's attention
    (attention_kind, the head norms)."""

    name = "qwen3_moe"
    model_types = ("qwen3_moe",)
    hf_classes = ("Qwen3MoeForCausalLM",)
    attention_kind = "qk_norm"
    config_class: Any = Qwen3MoeConfig
    model_class: Any = Qwen3MoeForCausalLM

    def build_extras(self, cfg: Any) -> dict[str, Any]:
        return {**super().build_extras(cfg), "norm_topk_prob": True}


FAMILY = Qwen3MoeFamily()
