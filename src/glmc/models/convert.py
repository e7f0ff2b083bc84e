"""Hugging Face model -> canonical Transformer, through the family its config's model_type names; a model
with a NaN or Inf weight is refused here, before it surfaces deep inside a matcher.
"""

from __future__ import annotations

import copy

import torch

from glmc.models.canonical import CanonicalTransformer
from glmc.models.families import family_of_hf


def nonfinite_weight(model: torch.nn.Module) -> tuple[str, int, int] | None:
    """(name, entries that are NaN or Inf, all its entries) of the model's first such parameter, else None."""
    for name, p in model.named_parameters():
        if p.is_meta or not p.is_floating_point():  # no data to test (glmc.api_inputs names meta weights)
            continue
        # a sum with a NaN or Inf in it is not finite: only then the entries are tested (no mask the size of
        # a vocabulary's embedding for every model; a finite sum that overflows is tested too)
        if bool(torch.isfinite(p.detach().sum())):
            continue
        finite = torch.isfinite(p.detach())
        if not bool(finite.all()):
            return name, int((~finite).sum()), p.numel()
    return None


def check_finite(model: torch.nn.Module, name: str = "the model") -> None:
    """ValueError naming `name` and the first parameter holding NaN or Inf."""
    found = nonfinite_weight(model)
    if found is not None:
        tensor, bad, total = found
        raise ValueError(
            f"{name}'s weight {tensor} holds {bad} NaN or infinite value(s) of {total}: a model with non-finite "
            "weights has no loss barrier and cannot be aligned; load a checkpoint saved before its training "
            "diverged, or train it again"
        )


HALF = (torch.bfloat16, torch.float16)


def in_float32(model: torch.nn.Module) -> torch.nn.Module:
    """The model itself, or a float32 copy where any weight is bfloat16 or float16 (folding would round)."""
    if not any(p.dtype in HALF for p in model.parameters()):
        return model
    return copy.deepcopy(model).float()


def to_canonical(hf_model, name: str = "the model") -> CanonicalTransformer:
    """The canonical form of a Hugging Face model (a canonical one as it is), in float32 (a half-precision
    model through a float32 copy, its `source`); ValueError naming `name` for a non-finite weight."""
    check_finite(hf_model, name)
    if isinstance(hf_model, CanonicalTransformer):
        return hf_model
    hf_model = in_float32(hf_model)
    return family_of_hf(hf_model).to_canonical(hf_model).with_source(hf_model)
