"""Vanilla averaging: no alignment, the original parameters are interpolated."""

from __future__ import annotations

import torch

from glmc.alignment import Alignment
from glmc.matching.base import MatchContext, Matcher
from glmc.models.canonical import CanonicalTransformer


class VanillaMatcher(Matcher):
    interpolates_originals = True

    def __init__(self, name: str = "vanilla"):
        self.name = name

    def match(self, a: torch.nn.Module, b: torch.nn.Module, context: MatchContext | None = None) -> Alignment:
        """The path between the original models: canonical ones are read through their source; other
        models (the pipeline passes the original models themselves) as they are."""
        if isinstance(a, CanonicalTransformer) or isinstance(b, CanonicalTransformer):
            if getattr(a, "source", None) is None or getattr(b, "source", None) is None:
                raise ValueError(
                    "vanilla interpolates the original parameters: pass canonical models made by "
                    "glmc.to_canonical (they keep their source model)"
                )
            a, b = a.source, b.source
        return Alignment(reference=a, model=b)
