"""The Qwen2-MoE family: Hugging Face Qwen2MoeForCausalLM <-> canonical Transformer, through the Llama
conversion.

Qwen2's attention (biases on queries, keys and values; sliding windows by layer_types) with a mixture of
SwiGLU experts and a shared expert behind a sigmoid gate (blocks.moe_shared): Mixtral's experts, the shared
expert's gate, up and down weights as a gated MLP's, its gate as shared_sigmoid_w, the post-attention
RMSNorm's gain folded into every reader. Routing renormalises the top experts' weights where norm_topk_prob
says. Layers with a dense MLP (mlp_only_layers, decoder_sparse_step > 1) are refused.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn
from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

from glmc.models.canonical import CanonicalTransformer
from glmc.models.export import set_linear, set_param
from glmc.models.families.fold import bias64
from glmc.models.families.mixtral import MixtralFamily


def check_sparse(cfg: Any) -> None:
    """Refuse a config with dense MLP layers: the canonical layers are all mixtures."""
    dense = list(getattr(cfg, "mlp_only_layers", None) or ())
    if dense or getattr(cfg, "decoder_sparse_step", 1) != 1:
        raise NotImplementedError(
            f"{cfg.model_type} with dense MLP layers (mlp_only_layers={dense}, decoder_sparse_step="
            f"{cfg.decoder_sparse_step}): every layer must be a mixture of experts (mlp_only_layers=[], "
            "decoder_sparse_step=1)"
        )


class SparseMoeFamily(MixtralFamily):
    """Mixtral's experts as the Qwen MoE configs lay them out: num_experts experts of moe_intermediate_size
    units, routing renormalised where norm_topk_prob says, every layer a mixture (check_sparse)."""

    experts_key = "num_experts"

    def build_extras(self, cfg: Any) -> dict[str, Any]:
        return {
            "num_experts": cfg.num_experts,
            "num_experts_per_tok": cfg.experts_per_token,
            "moe_intermediate_size": cfg.mlp_size,
        }

    def to_canonical(self, hf_model) -> CanonicalTransformer:
        check_sparse(hf_model.config)
        return super().to_canonical(hf_model)

    def to_hf(self, model, template) -> nn.Module:
        check_sparse(template.config)
        return super().to_hf(model, template)


class Qwen2MoeFamily(SparseMoeFamily):
    name = "qwen2_moe"
    model_types = ("qwen2_moe",)
    hf_classes = ("Qwen2MoeForCausalLM",)
    mlp_kind = "moe_shared"
    config_class: Any = Qwen2MoeConfig
    model_class: Any = Qwen2MoeForCausalLM

    def build_extras(self, cfg: Any) -> dict[str, Any]:
        return {**super().build_extras(cfg), "shared_expert_intermediate_size": cfg.mlp_size}

    def mlp_params(self, mlp: nn.Module, g, gamma: Tensor) -> dict[str, Tensor]:
        shared, width = mlp.shared_expert, mlp.shared_expert.down_proj.out_features
        units = shared.gate_proj.out_features
        return {
            **super().mlp_params(mlp, g, gamma),
            "gate_w": g(shared.gate_proj.weight) * gamma,
            "gate_b": bias64(shared.gate_proj, units),
            "in_w": g(shared.up_proj.weight) * gamma,
            "in_b": bias64(shared.up_proj, units),
            "out_w": g(shared.down_proj.weight),
            "out_b": bias64(shared.down_proj, width),
            "shared_sigmoid_w": g(mlp.shared_expert_gate.weight) * gamma,
        }

    def set_mlp(self, mlp: nn.Module, p, pre: str) -> None:
        super().set_mlp(mlp, p, pre)
        shared = mlp.shared_expert
        set_linear(shared.gate_proj, p(pre + "gate_w"), p(pre + "gate_b"), pre + "gate")
        set_linear(shared.up_proj, p(pre + "in_w"), p(pre + "in_b"), pre + "in")
        set_linear(shared.down_proj, p(pre + "out_w"), p(pre + "out_b"), pre + "out")
        set_param(mlp.shared_expert_gate.weight, p(pre + "shared_sigmoid_w"), pre + "shared_sigmoid_w")


FAMILY = Qwen2MoeFamily()
