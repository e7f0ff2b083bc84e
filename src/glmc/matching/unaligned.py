"""Canonical form without alignment: shows what the reparameterisation alone does to the path."""

from __future__ import annotations

from glmc.alignment import Alignment
from glmc.matching.base import MatchContext, Matcher, circuit_pairs, require_factored
from glmc.models.canonical import CanonicalTransformer
from glmc.ranges import check_settings
from glmc.settings.methods import CanonicalMatcherConfig


class CanonicalMatcher(Matcher):
    def __init__(self, name: str = "canonical", qk: str = "circuit", vo: str = "circuit"):
        check_settings(CanonicalMatcherConfig, f"matcher.{name}", locals())  # the ranges glmc.settings declares
        self.name, self.circuits = name, circuit_pairs(qk, vo)

    def match(self, a: CanonicalTransformer, b: CanonicalTransformer, context: MatchContext | None = None) -> Alignment:
        require_factored(self.name, a, b)
        return Alignment(reference=a, model=b, circuits=self.circuits)
