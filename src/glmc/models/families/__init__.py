"""Model families as data: one module per architecture, the only code that names its HF classes and tensors.

A family module builds its Hugging Face model, converts it to the canonical Transformer and back, embeds
its inputs and gives each embedding and head tensor its role (roles.py); the registry (registry.py)
finds a family by name or by a Hugging Face config's `model_type`.
"""

from glmc.models.families.registry import (
    families_for_data,
    family_named,
    family_names,
    family_of_hf,
    family_of_model_type,
)

__all__ = ["families_for_data", "family_named", "family_names", "family_of_hf", "family_of_model_type"]
