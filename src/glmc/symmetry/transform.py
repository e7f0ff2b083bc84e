"""Transform: one group element per symmetry space, keyed by space name."""

from __future__ import annotations

import torch

from glmc.models.families.roles import HEAD_PAIRS
from glmc.symmetry.groups import (
    CLASSES,
    Element,
    Invertible,
    Orthogonal,
    OrthogonalScale,
    Permutation,
    RotaryScale,
    SemiPermutation,
    SignedPermutation,
)
from glmc.symmetry.spec import SymmetrySpec


class Transform(dict[str, Element]):
    """Mapping space name -> group element; spaces left out are untouched by apply."""

    def to(self, device=None, dtype=None) -> Transform:
        return Transform({name: g.to(device, dtype) for name, g in self.items()})

    @classmethod
    def sample(
        cls, spec: SymmetrySpec, classes: dict[str, str], generator=None, grow: int = 0, dtype=torch.float32
    ) -> Transform:
        """Random elements for every space whose kind is in `classes` (kind -> class name).

        `grow` extra units for widening classes (rectangular orthogonal, semi-permutation). The heads
        count of qk/vo follows a widening of heads in the same layer, as apply runs heads first.
        """
        out, heads_after = cls(), {}
        for space in spec:
            kind = classes.get(space.kind)
            if kind is None:
                continue
            if kind not in CLASSES:
                raise ValueError(f"class {kind!r} for space {space.name} is not one of {sorted(CLASSES)}")
            n = space.size
            heads = space.heads  # per expert (expert_units) as the spec says; per head after widening
            if space.kind in ("qheads", *HEAD_PAIRS):
                heads = heads_after.get(space.layer, space.heads)
            if kind == "permutation":
                g = Permutation.sample(n, generator, heads)
            elif kind == "semi_permutation":
                g = SemiPermutation.sample(n, n + grow, generator, dtype)
            elif kind == "orthogonal":
                g = Orthogonal.sample(n, generator, n + grow, dtype)
            elif kind == "signed_permutation":
                g = SignedPermutation.sample(n, generator, dtype)
            elif kind in ("diagonal", "positive_diagonal"):
                g = CLASSES[kind].sample(n, generator, dtype, heads)
            elif kind == "rotary_scale":
                g = RotaryScale.sample(heads, n, generator, dtype, rotary_dims=space.rotary_dims)
            elif kind in ("invertible", "orthogonal_scale"):
                per_head = {"invertible": Invertible, "orthogonal_scale": OrthogonalScale}
                g = per_head[kind].sample(heads, n, generator, dtype)
            else:
                raise NotImplementedError(f"sampling {kind} elements")
            if space.kind == "heads":
                heads_after[space.layer] = len(g.src) if kind == "semi_permutation" else n
            out[space.name] = g
        return out
