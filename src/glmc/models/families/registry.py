"""Family lookup by name, by Hugging Face `model_type` and by HF model; family modules load on first use
and this module imports none, so the canonical model (which looks families up) sits below them.
"""

from __future__ import annotations

import importlib
from functools import cache

# family name -> the module that defines FAMILY; one line per family
MODULES = {
    "vit": "glmc.models.families.vit",
    "gpt2": "glmc.models.families.gpt2",
    "bert": "glmc.models.families.bert",
    "roberta": "glmc.models.families.roberta",
    "llama": "glmc.models.families.llama",
    "gemma": "glmc.models.families.gemma",
    "gemma2": "glmc.models.families.gemma2",
    "gemma3": "glmc.models.families.gemma3",
    "qwen3": "glmc.models.families.qwen3",
    "olmo2": "glmc.models.families.olmo2",
    "mixtral": "glmc.models.families.mixtral",
    "qwen2_moe": "glmc.models.families.qwen2_moe",
    "qwen3_moe": "glmc.models.families.qwen3_moe",
    "olmoe": "glmc.models.families.olmoe",
    "opt": "glmc.models.families.opt",
    "gpt_neox": "glmc.models.families.gpt_neox",
}


def family_names() -> list[str]:
    return list(MODULES)


def families_for_data(kind: str) -> list[str]:
    """The families that train on data of this kind ("images", "text")."""
    return [name for name in MODULES if family_named(name).data_kind == kind]


@cache
def family_named(name: str):
    """The family called `name` (a model config's `family`, a canonical config's `family`)."""
    if name not in MODULES:
        raise ValueError(f"unknown model family {name!r}; known: {', '.join(MODULES)}")
    return importlib.import_module(MODULES[name]).FAMILY


def family_of_model_type(model_type: str | None):
    """The family whose Hugging Face configs carry `model_type` (e.g. a checkpoint's config.json)."""
    for name in MODULES:
        family = family_named(name)
        if model_type in family.model_types:
            return family
    known = sorted(t for name in MODULES for t in family_named(name).model_types)
    raise ValueError(f"no model family reads Hugging Face model_type {model_type!r}; known: {', '.join(known)}")


def family_of_hf(model):
    """The family of a Hugging Face model, from its config's model_type; TypeError for anything else."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    try:
        family = family_of_model_type(model_type)
    except ValueError as err:
        raise TypeError(f"no canonical converter for {type(model).__name__}: {err}") from None
    if type(model).__name__ not in family.hf_classes:
        raise TypeError(
            f"no canonical converter for {type(model).__name__}; the {family.name} family converts "
            f"{', '.join(family.hf_classes)}"
        )
    return family
