"""The matcher interface: every alignment method, pairwise or multi-model, sits behind it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Protocol

import torch


@dataclass
class Alignment:
    """Result of aligning model B to reference model A.

    `reference` is model A in the parameterisation the method interpolates in (the original HF
    model for vanilla, the canonical model for symmetry-aware methods); `model` is model B in the
    same parameterisation, transformed, and computes the same function as B. `transform` holds the
    group elements found (None for methods without one)."""

    reference: torch.nn.Module
    model: torch.nn.Module
    transform: Optional[Any] = None
    diagnostics: dict[str, Any] = field(default_factory=dict)


class Matcher(Protocol):
    name: str

    def match(self, model_a: torch.nn.Module, model_b: torch.nn.Module, data: Any = None) -> Alignment: ...
