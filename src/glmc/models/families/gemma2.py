"""The Gemma 2 family: Hugging Face Gemma2ForCausalLM <-> canonical Transformer, through the Llama conversion.

Gemma's (1 + w) RMSNorm gains and scaled embeddings, with a norm on each sublayer's output too (sandwich
norms, blocks.sandwich: attn_post, mlp_post hold their gains 1 + w); the pre-norms before attention and
before the MLP (pre_feedforward_layernorm) fold into the readers. Attention scores and the logits are
soft-capped (cap * tanh(x / cap), CanonicalConfig.attn_softcap and logit_softcap): the caps change no
symmetry. Layers alternate sliding-window and global attention (layer_types); queries are scaled by
query_pre_attn_scalar ** -0.5 (folded into q_w). The sandwich norms' gains leave the residual stream
only its permutations.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import Gemma2Config, Gemma2ForCausalLM

from glmc.models.export import set_param
from glmc.models.families.gemma import GemmaFamily

_SANDWICH_NOTE = "a norm with a learned gain on each sublayer's output: only signed permutations commute with the gain"


def softcap(x: Tensor, cap: float | None) -> Tensor:
    """cap * tanh(x / cap), x itself where cap is None."""
    return x if cap is None else cap * torch.tanh(x / cap)


class Gemma2Family(GemmaFamily):
    name = "gemma2"
    model_types = ("gemma2",)
    hf_classes = ("Gemma2ForCausalLM",)
    branch_kind = "sandwich"
    residual_classes = ("signed_permutation", "permutation")
    residual_note = _SANDWICH_NOTE
    config_class: Any = Gemma2Config
    model_class: Any = Gemma2ForCausalLM
    # the norms on the sublayers' outputs, as the decoder layer names them
    branch_modules = {"attn_post": "post_attention_layernorm", "mlp_post": "post_feedforward_layernorm"}

    def activation(self, cfg: Any) -> str:
        return cfg.hidden_activation

    def reader_gain(self, layer: nn.Module, sublayer: str, g) -> Tensor | float:
        norm = layer.input_layernorm if sublayer == "attn" else layer.pre_feedforward_layernorm
        return self.norm_offset + g(norm.weight)

    def branch_norms(self, layer: nn.Module, g) -> dict[str, Tensor]:
        return {
            name: self.norm_offset + g(getattr(layer, module).weight) for name, module in self.branch_modules.items()
        }

    def set_layer_norms(self, layer: nn.Module, p, pre: str, identity_gain: float) -> None:
        layer.input_layernorm.weight.fill_(identity_gain)
        layer.pre_feedforward_layernorm.weight.fill_(identity_gain)
        for name, module in self.branch_modules.items():
            set_param(getattr(layer, module).weight, p(pre + name) - self.norm_offset, pre + name)

    def hf_config_problems(self, hf_config: Any) -> list[str]:
        """Beyond Gemma's: transformers applies a soft cap that is set as cap * tanh(x / cap) and switches it
        off for null only, so a cap of 0 (x / 0) or an infinite one (0 * inf) makes every score or logit 0
        or NaN."""
        problems = super().hf_config_problems(hf_config)
        for key, what in (("attn_logit_softcapping", "attention score"), ("final_logit_softcapping", "logit")):
            cap = getattr(hf_config, key, None)
            if isinstance(cap, (int, float)) and (cap == 0 or not math.isfinite(cap)):
                problems.append(
                    f"its config.json's {key}={cap}: transformers applies a cap that is set as cap * tanh(x / cap), "
                    f"so {cap} makes every {what} 0 or NaN instead of switching the cap off; set {key} to null to "
                    "switch it off (or to the cap the model was trained with)"
                )
        return problems

    def config_extras(self, cfg: Any) -> dict[str, Any]:
        return {"attn_softcap": cfg.attn_logit_softcapping, "logit_softcap": cfg.final_logit_softcapping}

    def to_hf(self, model, template) -> nn.Module:
        theirs = self.config_extras(template.config)
        own = {key: getattr(model.config, key) for key in theirs}
        if theirs != own:
            raise ValueError(
                f"the template's soft caps (and rotary bases) {theirs} are not the model's {own}: export to a "
                "template with the same"
            )
        return super().to_hf(model, template)

    def head(self, config, p: dict[str, Tensor], x: Tensor, record) -> Tensor:
        return softcap(F.linear(x, p["head.w"]), config.logit_softcap)

    def build(self, cfg) -> nn.Module:
        return self.model_class(self.config_class(**self.hf_settings(cfg)))

    def hf_settings(self, cfg) -> dict[str, Any]:
        """The Hugging Face config's settings for a model config (glmc.config.ModelConfig)."""
        kv_heads = cfg.num_kv_heads or cfg.num_heads
        if cfg.num_heads % kv_heads:
            raise ValueError(f"model.num_heads={cfg.num_heads} is not a multiple of model.num_kv_heads={kv_heads}")
        head_dim = cfg.hidden_size // cfg.num_heads
        return dict(
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.hidden_size,
            intermediate_size=cfg.mlp_size,
            num_hidden_layers=cfg.num_layers,
            num_attention_heads=cfg.num_heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            query_pre_attn_scalar=head_dim,
            hidden_activation=cfg.hidden_act,
            max_position_embeddings=cfg.max_positions,
            # every other layer attends within half the positions, as Gemma 2 alternates local and global
            sliding_window=max(1, cfg.max_positions // 2),
            rms_norm_eps=cfg.layer_norm_eps,
            tie_word_embeddings=cfg.tie_embeddings,
            rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
            attention_dropout=cfg.dropout,
            pad_token_id=None,
            bos_token_id=None,
            eos_token_id=None,
            attn_implementation="eager",  # soft-capping has no SDPA path
        )

    def input_properties(self, config, params):
        yield from super().input_properties(config, params)
        yield "has attention and logit soft caps {}", (config.attn_softcap, config.logit_softcap)


FAMILY = Gemma2Family()
