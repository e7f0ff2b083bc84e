"""Canonical form without alignment: shows what the reparameterisation alone does to the path."""
from __future__ import annotations

from glmc.matching.base import Alignment
from glmc.matching.weight import as_canonical


class CanonicalMatcher:
    name = "canonical"

    def __init__(self, circuits: bool = True):
        self.circuits = circuits

    def match(self, model_a, model_b, data=None) -> Alignment:
        a, b = as_canonical(model_a), as_canonical(model_b)
        if self.circuits:
            a, b = a.to_circuit(), b.to_circuit()
        return Alignment(reference=a, model=b)
