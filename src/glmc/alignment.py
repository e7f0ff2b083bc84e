"""What aligning model B to model A returns; below matching, eval and merging, which all read it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from glmc.interpolation import interpolate


@dataclass
class Alignment:
    """Aligning model B to reference model A: `reference` is A and `model` is B transformed, in the method's
    parameterisation; `circuits`: the head pairs interpolated as circuits; `function_preserving` is False where
    `model` no longer computes B's function; `variants`: further paths to evaluate (a hard projection)."""

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
