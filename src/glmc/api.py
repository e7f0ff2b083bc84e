"""Public entry points for people who bring their own models.

    from glmc import to_canonical, align, interpolate, evaluate_path
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from glmc.matching.base import Alignment, Matcher
from glmc.matching.canonical import CanonicalMatcher
from glmc.matching.vanilla import VanillaMatcher
from glmc.matching.weight import WeightMatcher

# Data-free methods by name; options are the constructor's keyword arguments.
PAIRWISE: dict[str, Callable[..., Matcher]] = {
    "vanilla": VanillaMatcher,
    "canonical": CanonicalMatcher,
    "weight": WeightMatcher,
    "weight_perm": lambda **options: WeightMatcher(name="weight_perm", residual="permutation", **options),
}


def align(model_a: torch.nn.Module, model_b: torch.nn.Module, matcher: str | Matcher = "weight",
          data: Any = None, **options) -> Alignment:
    """Align model B to model A.

    `matcher` is a method name (vanilla, canonical, weight, weight_perm) whose constructor gets
    `options` (e.g. max_iter=5, circuits=False), or any object with a `match(a, b, data)` method.
    Returns an Alignment: `.model` is B transformed (same function as B), `.reference` is A in the
    same parameterisation, `.transform` the group elements, `.diagnostics` the method's record."""
    if isinstance(matcher, str):
        if matcher not in PAIRWISE:
            raise ValueError(f"matcher={matcher!r} is not one of {sorted(PAIRWISE)}; "
                             "learned matching runs through run.py (matcher=learned) or LearnedMatcher")
        matcher = PAIRWISE[matcher](**options)
    elif options:
        raise TypeError("options apply to a matcher given by name")
    return matcher.match(model_a, model_b, data)
