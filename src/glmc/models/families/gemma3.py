"""The Gemma 3 text family: Hugging Face Gemma3ForCausalLM <-> canonical Transformer, through Gemma 2's.

Gemma 2's layout (sandwich norms, (1 + w) gains, scaled embeddings, optional soft caps) with an RMSNorm on
each head's queries and keys before rotary (blocks.qk_norm: q_norm, k_norm hold the gains 1 + w, the
query_pre_attn_scalar ** -0.5 scale folded into q_norm), and sliding-window layers that rotate with a base
of their own (rope_parameters["sliding_attention"], CanonicalConfig.rope_local_theta) and no scaling. The
group: Gemma 2's (residual permutations only) without the per-head query/key maps.
"""

from __future__ import annotations

from typing import Any

from transformers import Gemma3ForCausalLM, Gemma3TextConfig

from glmc.models.families.gemma2 import Gemma2Family
from glmc.models.families.llama import rope_parameters
from glmc.models.families.qwen3 import QueryKeyNormHooks


def local_rope(cfg: Any) -> float | None:
    """The rotary base of a Gemma 3 config's sliding-window layers; NotImplementedError for a scaled rotary
    there (the canonical form rotates those layers unscaled)."""
    params = rope_parameters(cfg, "sliding_attention")
    kind = params.get("rope_type", "default")
    if kind != "default":
        raise NotImplementedError(
            f"rope_parameters.sliding_attention.rope_type={kind!r}: the sliding-window layers of a gemma3_text "
            "model convert with the default rotary only"
        )
    theta = params.get("rope_theta")
    return None if theta is None else float(theta)


class Gemma3Family(QueryKeyNormHooks, Gemma2Family):
    name = "gemma3"
    model_types = ("gemma3_text",)
    hf_classes = ("Gemma3ForCausalLM",)
    attention_kind = "qk_norm"
    config_class: Any = Gemma3TextConfig
    model_class: Any = Gemma3ForCausalLM

    def config_extras(self, cfg: Any) -> dict[str, Any]:
        return {**super().config_extras(cfg), "rope_local_theta": local_rope(cfg)}

    def hf_settings(self, cfg) -> dict[str, Any]:
        """Gemma 2's, with a rotary base per layer type (the sliding-window layers' Gemma 3's 10000) and
        sliding-window and global layers alternating as in Gemma 2."""
        settings = super().hf_settings(cfg)
        full = settings["rope_parameters"]
        layers = cfg.num_layers
        return {
            **settings,
            "rope_parameters": {
                "full_attention": full,
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            },
            "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)],
        }

    def input_properties(self, config, params):
        yield from super().input_properties(config, params)
        yield "has a rotary base {} in its sliding-window layers", config.rope_local_theta


FAMILY = Gemma3Family()
