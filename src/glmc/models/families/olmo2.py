"""The OLMo-2 family: Hugging Face Olmo2ForCausalLM <-> canonical Transformer, through the Llama conversion.

No norm before the sublayers (they read the raw stream: pre_norms False); an RMSNorm with a gain after each
(sandwich norms, blocks.sandwich: attn_post, mlp_post), and one RMSNorm over all heads' queries together and
one over all keys before rotary (blocks.qk_norm_all: q_norm, k_norm laid out by head, the 1/sqrt(head_dim)
scale folded into q_norm). The group: residual signed permutations, head permutations with the norms' gains,
value/output maps, MLP units.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn
from transformers import Olmo2Config, Olmo2ForCausalLM

from glmc.models.export import set_param
from glmc.models.families.llama import LlamaFamily


class Olmo2Family(LlamaFamily):
    name = "olmo2"
    model_types = ("olmo2",)
    hf_classes = ("Olmo2ForCausalLM",)
    attention_kind = "qk_norm_all"
    branch_kind = "sandwich"
    pre_norms = False
    residual_classes = ("signed_permutation", "permutation")
    residual_note = (
        "a norm with a learned gain on each sublayer's output: only signed permutations commute with the gain"
    )
    config_class: Any = Olmo2Config
    model_class: Any = Olmo2ForCausalLM
    # the norms on the sublayers' outputs, as the decoder layer names them
    branch_modules = {"attn_post": "post_attention_layernorm", "mlp_post": "post_feedforward_layernorm"}

    def query_scale(self, attn: nn.Module) -> float:
        return 1.0

    def head_norms(self, attn: nn.Module, g) -> dict[str, Tensor]:
        k = attn.config.num_key_value_heads
        q_norm = attn.scaling * g(attn.q_norm.weight)
        return {"q_norm": q_norm.reshape(k, -1, attn.head_dim), "k_norm": g(attn.k_norm.weight).reshape(k, -1)}

    def set_head_norms(self, attn: nn.Module, p, pre: str) -> None:
        set_param(attn.q_norm.weight, p(pre + "q_norm").flatten() / attn.scaling, pre + "q_norm")
        set_param(attn.k_norm.weight, p(pre + "k_norm").flatten(), pre + "k_norm")

    def reader_gain(self, layer: nn.Module, sublayer: str, g) -> Tensor | float:
        return 1.0  # the sublayers read the stream as it is

    def branch_norms(self, layer: nn.Module, g) -> dict[str, Tensor]:
        return {name: g(getattr(layer, module).weight) for name, module in self.branch_modules.items()}

    def set_layer_norms(self, layer: nn.Module, p, pre: str, identity_gain: float) -> None:
        for name, module in self.branch_modules.items():
            set_param(getattr(layer, module).weight, p(pre + name), pre + name)


FAMILY = Olmo2Family()
