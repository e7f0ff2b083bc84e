"""The Mixtral family: Hugging Face MixtralForCausalLM <-> canonical Transformer, through the Llama conversion.

Llama's attention with a mixture of SwiGLU experts for the MLP (blocks.moe): the router's rows and each
expert's gate, up and down weights stacked, the post-attention RMSNorm's gain folded into the router and the
experts' readers; top num_experts_per_tok experts, their softmax weights renormalised. Sliding windows
convert as Mistral's do (every layer).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from transformers import MixtralConfig, MixtralForCausalLM

from glmc.models.blocks import block_kind
from glmc.models.export import set_param
from glmc.models.families.llama import LlamaFamily
from glmc.ranges import finite_number


class MixtralFamily(LlamaFamily):
    name = "mixtral"
    model_types = ("mixtral",)
    hf_classes = ("MixtralForCausalLM",)
    mlp_kind = "moe"
    own_model_keys = (*LlamaFamily.own_model_keys, "num_experts", "experts_per_token")
    model_keys = (*LlamaFamily.model_keys, "num_experts", "experts_per_token")
    # an expert added to embed a smaller mixture would take a share of the routing: no exact embedding
    shared_model_keys = (*LlamaFamily.shared_model_keys, "num_experts", "experts_per_token")
    config_class: Any = MixtralConfig
    model_class: Any = MixtralForCausalLM
    experts_key = "num_local_experts"  # the Hugging Face config's count of experts per layer

    def build_extras(self, cfg: Any) -> dict[str, Any]:
        return {"num_local_experts": cfg.num_experts, "num_experts_per_tok": cfg.experts_per_token}

    def model_problems(self, model: Any, prefix: str, checked: set[str]) -> list[str]:
        """Beyond Llama's: a token's experts must be among the experts there are."""
        problems = super().model_problems(model, prefix, checked)
        k, n = model.experts_per_token, model.num_experts
        if {"num_experts", "experts_per_token"} & checked and finite_number(k) and finite_number(n) and k > n:
            problems.append(
                f"{prefix}.experts_per_token={k} is more than {prefix}.num_experts={n}: route each token to at "
                f"most {n} experts"
            )
        return problems

    def hf_config_problems(self, hf_config: Any) -> list[str]:
        """Beyond Llama's: a token's experts must be among the experts there are (transformers fails deep
        in its routing otherwise)."""
        problems = super().hf_config_problems(hf_config)
        k, n = getattr(hf_config, "num_experts_per_tok", None), getattr(hf_config, self.experts_key, None)
        if isinstance(k, int) and isinstance(n, int) and not 1 <= k <= n:
            problems.append(
                f"its config.json routes each token to num_experts_per_tok={k} experts of {self.experts_key}={n}: "
                f"a token is routed to 1 to {n} of the experts there are; save the model with num_experts_per_tok "
                f"between 1 and {n}"
            )
        return problems

    def mlp_params(self, mlp: nn.Module, g, gamma: Tensor) -> dict[str, Tensor]:
        experts = mlp.experts
        gate, up = g(experts.gate_up_proj).chunk(2, dim=1)
        return {
            "router_w": g(mlp.gate.weight) * gamma,
            "expert_gate_w": gate * gamma,
            "expert_in_w": up * gamma,
            "expert_out_w": g(experts.down_proj),
        }

    def set_mlp(self, mlp: nn.Module, p, pre: str) -> None:
        set_param(mlp.gate.weight, p(pre + "router_w"), pre + "router_w")
        joined = torch.cat([p(pre + "expert_gate_w"), p(pre + "expert_in_w")], 1)
        set_param(mlp.experts.gate_up_proj, joined, pre + "expert_gate_w and expert_in_w")
        set_param(mlp.experts.down_proj, p(pre + "expert_out_w"), pre + "expert_out_w")

    def mlp_units(self, sizes: dict[str, list[int]], layer: int) -> int:
        return sizes["expert_units"][layer]

    def config_extras(self, cfg: Any) -> dict[str, Any]:
        # Mixtral always renormalises its top-k weights; its MoE descendants say so by norm_topk_prob
        renormalise = bool(getattr(cfg, "norm_topk_prob", True))
        return {"block_settings": {"experts_top_k": cfg.num_experts_per_tok, "experts_renormalise": renormalise}}

    def input_properties(self, config, params):
        yield from super().input_properties(config, params)
        yield "routes each token to {} experts", block_kind(self.mlp_kind).settings_of(config).experts_top_k


FAMILY = MixtralFamily()
