"""glmc: symmetry-aware alignment of Transformers and loss barriers along linear paths."""

from glmc import symmetries  # callable: glmc.symmetries(model) audits the model's symmetry group
from glmc.api import align, evaluate, evaluate_path, to_canonical
from glmc.eval.evaluator import Evaluator
from glmc.interpolation import interpolate

__all__ = ["Evaluator", "align", "evaluate", "evaluate_path", "interpolate", "symmetries", "to_canonical"]
