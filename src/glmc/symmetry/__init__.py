from glmc.symmetry.apply import apply, apply_dense, apply_params
from glmc.symmetry.groups import Invertible, Orthogonal, OrthogonalScale, Permutation, SemiPermutation
from glmc.symmetry.spec import Axis, Space, SymmetrySpec
from glmc.symmetry.transform import Transform

__all__ = [
    "apply",
    "apply_dense",
    "apply_params",
    "Axis",
    "Invertible",
    "Orthogonal",
    "OrthogonalScale",
    "Permutation",
    "SemiPermutation",
    "Space",
    "SymmetrySpec",
    "Transform",
]
