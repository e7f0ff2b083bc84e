"""The OLMoE family: Hugging Face OlmoeForCausalLM <-> canonical Transformer, through the Llama conversion.

Pre-norm as Llama, with OLMo-2's attention (one RMSNorm over all heads' queries together and one over all
keys before rotary: blocks.qk_norm_all, the 1/sqrt(head_dim) scale folded into q_norm) and a mixture of
SwiGLU experts (blocks.moe, as Mixtral's), routing renormalised where norm_topk_prob says. The group:
residual orthogonal maps and permutations, head permutations with the norms' gains, value/output maps, the
experts' order and each expert's units. Clipped queries, keys and values (clip_qkv) are refused.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from transformers import OlmoeConfig, OlmoeForCausalLM

from glmc.models.canonical import CanonicalTransformer
from glmc.models.families.mixtral import MixtralFamily
from glmc.models.families.olmo2 import Olmo2Family


def check_unclipped(cfg: Any) -> None:
    if getattr(cfg, "clip_qkv", None) is not None:
        raise NotImplementedError(
            f"olmoe with clip_qkv={cfg.clip_qkv}: clamped queries, keys and values are not linear in the weights, "
            "so no symmetry survives them; convert a model with clip_qkv=None"
        )


class OlmoeFamily(MixtralFamily):
    name = "olmoe"
    model_types = ("olmoe",)
    hf_classes = ("OlmoeForCausalLM",)
    attention_kind = "qk_norm_all"
    config_class: Any = OlmoeConfig
    model_class: Any = OlmoeForCausalLM
    experts_key = "num_experts"
    # OLMo-2's query/key norms over all heads, laid out by head
    query_scale = Olmo2Family.query_scale
    head_norms = Olmo2Family.head_norms
    set_head_norms = Olmo2Family.set_head_norms

    def build_extras(self, cfg: Any) -> dict[str, Any]:
        return {"num_experts": cfg.num_experts, "num_experts_per_tok": cfg.experts_per_token, "norm_topk_prob": True}

    def to_canonical(self, hf_model) -> CanonicalTransformer:
        check_unclipped(hf_model.config)
        return super().to_canonical(hf_model)

    def to_hf(self, model, template) -> nn.Module:
        check_unclipped(template.config)
        return super().to_hf(model, template)


FAMILY = OlmoeFamily()
