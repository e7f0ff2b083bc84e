"""glmc: symmetry-aware alignment of Transformers and loss barriers along linear paths."""

from glmc.api import (
    align,
    evaluate,
    evaluate_layerwise,
    evaluate_path,
    evaluate_plane,
    evaluate_tasks,
    fit_curve,
    to_canonical,
)
from glmc.eval.evaluator import Evaluator
from glmc.interpolation import interpolate


def __getattr__(name: str):
    # glmc.symmetries(model) audits a model's group; imported on first use, so that
    # `python -m glmc.symmetries` finds the module not yet imported
    if name == "symmetries":
        import importlib

        return importlib.import_module("glmc.symmetries")
    raise AttributeError(f"module 'glmc' has no attribute {name!r}")


__all__ = [
    "Evaluator",
    "align",
    "evaluate",
    "evaluate_layerwise",
    "evaluate_path",
    "evaluate_plane",
    "evaluate_tasks",
    "fit_curve",
    "interpolate",
    "symmetries",
    "to_canonical",
]
