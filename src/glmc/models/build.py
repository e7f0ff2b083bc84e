"""Build the Hugging Face model a ModelConfig describes, through its family; nothing is downloaded."""

from __future__ import annotations

from typing import Any

from torch import nn

from glmc.models.families import family_named


def build_model(cfg: Any) -> nn.Module:
    """`cfg`: a model config (glmc.config.ModelConfig, or any object with its fields)."""
    try:
        family = family_named(str(cfg.family))
    except ValueError as err:
        raise ValueError(f"model.family={cfg.family!r}: {err}") from None
    if cfg.hidden_size % cfg.num_heads:
        raise ValueError(f"model.hidden_size={cfg.hidden_size} is not divisible by model.num_heads={cfg.num_heads}")
    return family.build(cfg)
