"""Vanilla averaging: no alignment, the original parameters are interpolated."""
from __future__ import annotations

from glmc.matching.base import Alignment


class VanillaMatcher:
    name = "vanilla"

    def match(self, model_a, model_b, data=None) -> Alignment:
        return Alignment(reference=model_a, model=model_b)
