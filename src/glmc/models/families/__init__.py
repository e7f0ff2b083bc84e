"""Model families as data: one module per architecture, the only code that names its HF classes and tensors.

A family module (vit.py, gpt2.py) says how to build its Hugging Face model from a ModelConfig, how to
convert it to the canonical Transformer and back, how its inputs enter the residual stream, and the
*role* of each canonical tensor it adds. A role (roles.py) places a tensor relative to the spaces that
carry a symmetry group: for each space, the axis it acts on and the side (a writer into the space, or a
reader of it). The blocks' roles are shared by every family of the same block layout (roles.py); a
family declares its embedding and head tensors. symmetry.SymmetrySpec is derived from the roles, and
matchers, interpolation, merging, export and the compatibility check read the spec or the roles.

The registry (registry.py) finds a family by its name or by the `model_type` of a Hugging Face config,
so a checkpoint folder finds its family without being told.
"""

from glmc.models.families.registry import (
    families_for_data,
    family_named,
    family_names,
    family_of_hf,
    family_of_model_type,
)

__all__ = ["families_for_data", "family_named", "family_names", "family_of_hf", "family_of_model_type"]
