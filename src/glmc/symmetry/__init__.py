from glmc.symmetry.apply import apply, apply_dense, apply_params
from glmc.symmetry.groups import (
    Diagonal,
    Invertible,
    Orthogonal,
    OrthogonalScale,
    Permutation,
    PositiveDiagonal,
    RotaryScale,
    SemiPermutation,
    SignedPermutation,
)
from glmc.symmetry.spec import Axis, Space, SymmetrySpec
from glmc.symmetry.transform import Transform

__all__ = [
    "apply",
    "apply_dense",
    "apply_params",
    "Axis",
    "Diagonal",
    "Invertible",
    "Orthogonal",
    "OrthogonalScale",
    "Permutation",
    "PositiveDiagonal",
    "RotaryScale",
    "SemiPermutation",
    "SignedPermutation",
    "Space",
    "SymmetrySpec",
    "Transform",
]
