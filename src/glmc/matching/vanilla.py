"""Vanilla averaging: no alignment, the original parameters are interpolated."""

from __future__ import annotations

from glmc.alignment import Alignment
from glmc.matching.base import MatchContext, Matcher
from glmc.models.canonical import CanonicalTransformer


class VanillaMatcher(Matcher):
    def __init__(self, name: str = "vanilla"):
        self.name = name

    def match(self, a: CanonicalTransformer, b: CanonicalTransformer, context: MatchContext | None = None) -> Alignment:
        if a.source is None or b.source is None:
            raise ValueError(
                "vanilla interpolates the original parameters: pass canonical models made by "
                "glmc.to_canonical (they keep their source model)"
            )
        return Alignment(reference=a.source, model=b.source)
