"""Hugging Face model -> canonical Transformer, dispatched by model type."""

from glmc.models.canonical import CanonicalTransformer


def to_canonical(hf_model) -> CanonicalTransformer:
    # imported here so that glmc.models does not import transformers until a conversion is asked for
    from transformers import GPT2LMHeadModel, ViTForImageClassification

    from glmc.models.hf_gpt2 import gpt2_to_canonical
    from glmc.models.hf_vit import vit_to_canonical

    if isinstance(hf_model, CanonicalTransformer):
        return hf_model
    if isinstance(hf_model, ViTForImageClassification):
        return vit_to_canonical(hf_model).with_source(hf_model)
    if isinstance(hf_model, GPT2LMHeadModel):
        return gpt2_to_canonical(hf_model).with_source(hf_model)
    raise TypeError(
        f"no canonical converter for {type(hf_model).__name__}; supported: ViTForImageClassification, GPT2LMHeadModel"
    )
