"""glmc: symmetry-aware alignment of Transformers and loss barriers along linear paths."""

from glmc.api import align, evaluate, evaluate_path
from glmc.eval.evaluator import Evaluator
from glmc.interpolation import interpolate
from glmc.models.convert import to_canonical

__all__ = ["Evaluator", "align", "evaluate", "evaluate_path", "interpolate", "to_canonical"]
