"""What aligning model B to model A returns.

It lives below matching, eval and merging: matchers build it, the evaluator walks its path, merges
combine its models, and none of them needs another's code for that.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from glmc.interpolation import interpolate


@dataclass
class Alignment:
    """Result of aligning model B to reference model A.

    `reference` is A and `model` is B transformed, both in the parameterisation the method
    interpolates: the original (HF) models for vanilla, factored canonical models otherwise.
    `circuits` names the attention pairs ("qk", "vo") that are interpolated as circuits
    QK = Q~^T K~ and OV = W_O V~ rather than as factored weights (glmc.interpolation).
    `function_preserving` is False where `model` no longer computes exactly what B computes
    (soft permutations). `variants` are further paths the pipeline evaluates beside this one
    (e.g. the hard projection of a Sinkhorn run)."""

    reference: torch.nn.Module
    model: torch.nn.Module
    transform: Any | None = None
    circuits: tuple[str, ...] = ()
    diagnostics: dict[str, Any] = field(default_factory=dict)
    function_preserving: bool = True
    variants: dict[str, Alignment] = field(default_factory=dict)

    def interpolate(self, lam: float) -> torch.nn.Module:
        """The model at lam * reference + (1 - lam) * model, in this alignment's parameterisation."""
        return interpolate([self.reference, self.model], [lam, 1.0 - lam], circuits=self.circuits)
