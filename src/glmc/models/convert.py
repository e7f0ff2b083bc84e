"""Hugging Face model -> canonical Transformer, through the family its config's model_type names."""

from glmc.models.canonical import CanonicalTransformer
from glmc.models.families import family_of_hf


def to_canonical(hf_model) -> CanonicalTransformer:
    if isinstance(hf_model, CanonicalTransformer):
        return hf_model
    return family_of_hf(hf_model).to_canonical(hf_model).with_source(hf_model)
