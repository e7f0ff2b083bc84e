"""learned_dual: learned matching that trains a transform of each endpoint (beyond papers 001-003).

A gets latents of its own, T_A (started at the identity), learned beside B's T_B in the same module
(LearnedMatchingModule's `reference_init`); the path runs from T_A(theta_A) to T_B(theta_B), both hard
elements, so each end keeps its model's function. It reaches the same paths as learned matching (those
from A to T_A^-1 T_B(B)); only the optimisation differs. No Sinkhorn: a soft T_A would change A's function.
"""

from __future__ import annotations

import torch
from torch import Tensor

from glmc.matching.engine.residual_map import eigen_angles
from glmc.matching.learned import Begun, LearnedMatcher, as_dense, unsigned
from glmc.matching.learned_module import LearnedMatchingModule
from glmc.models.canonical import CanonicalTransformer, relative_deviation
from glmc.symmetry import Orthogonal, Permutation, apply


class LearnedDualMatcher(LearnedMatcher):
    """LearnedMatcher's settings; the learned latents of both endpoints' transforms (module docstring)."""

    def __init__(self, name: str = "learned_dual", units: str = "permutation", **settings):
        if str(units) == "sinkhorn":
            raise ValueError(
                f"matcher.{name}.units=sinkhorn: learned_dual keeps both endpoints' functions, so its "
                "unit latents are hard permutations: use units=permutation"
            )
        super().__init__(name=name, units=units, **settings)

    def checkpoint_key(self, a: CanonicalTransformer, b: CanonicalTransformer) -> str:
        return "dual_" + super().checkpoint_key(a, b)  # never resumes a one-sided run's latents

    def build_module(self, a: CanonicalTransformer, begun: Begun, kinds: dict, task: str) -> LearnedMatchingModule:
        """B's latents from the start, A's from the identity of every learned space."""
        if a.params().keys() != begun.b_fixed.params().keys() or a.width != begun.b_fixed.width:
            raise ValueError(f"{self.name} transforms both endpoints: A and B must share one architecture")
        init = {n: as_dense(unsigned(begun.start)[n]) for n in kinds}  # a signed start's order: B is flipped
        identity = {n: torch.eye(m.shape[0]) for n, m in init.items()}
        return LearnedMatchingModule(
            a, begun.b_fixed, init, kinds, self.settings, task, self.circuits, reference_init=identity
        )

    def reference(
        self, module: LearnedMatchingModule, a: CanonicalTransformer, inputs: Tensor, diagnostics: dict
    ) -> CanonicalTransformer:
        """T_A(A), with its deviation from A's logits, its changed units and its residual map's angles."""
        transform = module.hard_transform("a")
        aligned = apply(transform, a)
        with torch.no_grad():
            diagnostics["reference_deviation"] = relative_deviation(aligned(inputs), a(inputs))
        moved = {}
        for name, g in transform.items():
            if isinstance(g, Permutation):
                moved[name] = float((g.perm != torch.arange(g.size)).float().mean())
        diagnostics["reference_changed_units"] = moved
        residual = transform.get("residual")
        if isinstance(residual, Orthogonal):
            diagnostics["reference_angles"] = eigen_angles(residual.matrix)
        return aligned
