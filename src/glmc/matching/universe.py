"""Universe matching (paper 001 §4.3): align N models to one shared reference.

Each round aligns every original model to the anchor (first the first model) with a pairwise matcher,
then makes the anchor the plain mean of the aligned models, until it moves by less than `tol` relative
to its norm or after `max_rounds`; the transforms never compose.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from glmc.alignment import Alignment
from glmc.interpolation import interpolate
from glmc.matching.base import MatchContext, Matcher, require_factored
from glmc.models.canonical import CanonicalTransformer


@dataclass
class UniverseAlignment:
    """Models aligned to a common universe: `models[i]` is models[i] under `transforms[i]`; `anchor` the
    final mean; `circuits` the pairs interpolated as circuits; `alignments` the last round's results."""

    models: list[torch.nn.Module]
    transforms: list[Any]
    circuits: tuple[str, ...] = ()
    diagnostics: dict[str, Any] = field(default_factory=dict)
    function_preserving: bool = True
    anchor: torch.nn.Module | None = None
    alignments: list[Alignment] = field(default_factory=list, repr=False)

    def merge(self, weights: Sequence[float] | None = None) -> torch.nn.Module:
        """sum_i weights[i] * aligned model i (default: the plain mean), attention pairs in
        `circuits` merged as circuits."""
        n = len(self.models)
        weights = [1.0 / n] * n if weights is None else list(weights)
        return interpolate(self.models, weights, circuits=self.circuits)


def relative_change(new: torch.nn.Module, old: torch.nn.Module) -> float:
    """||theta_new - theta_old|| / ||theta_old|| over all parameters (float64)."""
    pn, po = new.state_dict(), old.state_dict()
    if pn.keys() != po.keys():
        raise ValueError("the anchors have different parameters")
    diff = norm = 0.0
    for name, t in po.items():
        if t.shape != pn[name].shape:
            raise ValueError(f"{name}: anchor shape changed from {tuple(t.shape)} to {tuple(pn[name].shape)}")
        t = t.detach().double()
        diff += float((pn[name].detach().double() - t).pow(2).sum())
        norm += float(t.pow(2).sum())
    return math.sqrt(diff / max(norm, 1e-300))


def universe_match(
    models: Sequence[CanonicalTransformer],
    matcher: Matcher,
    context: MatchContext | None = None,
    max_rounds: int = 10,
    tol: float = 1e-4,
) -> UniverseAlignment:
    """Align every model to a shared anchor with `matcher` (paper 001 §4.3)."""
    models = list(models)
    if len(models) < 2:
        raise ValueError(f"universe matching needs at least two models, got {len(models)}")
    if max_rounds < 1:
        raise ValueError(f"max_rounds={max_rounds}: at least one round")
    require_factored("universe matching", *models)
    context = MatchContext() if context is None else context
    n = len(models)
    start = time.perf_counter()
    anchor: torch.nn.Module = models[0]
    changes: list[float] = []
    alignments: list[Alignment] = []
    for _ in range(max_rounds):
        alignments = [matcher.match(anchor, m, context) for m in models]
        new_anchor = interpolate([a.model for a in alignments], [1.0 / n] * n, circuits=())
        changes.append(relative_change(new_anchor, anchor))
        anchor = new_anchor
        if changes[-1] < tol:
            break
    circuits = {tuple(a.circuits) for a in alignments}
    if len(circuits) != 1:
        raise ValueError(f"the pairwise alignments disagree on the circuit pairs: {sorted(circuits)}")
    return UniverseAlignment(
        models=[a.model for a in alignments],
        transforms=[a.transform for a in alignments],
        circuits=circuits.pop(),
        diagnostics={
            "rounds": len(changes),
            "anchor_change": changes,
            "converged": changes[-1] < tol,
            "seconds": time.perf_counter() - start,
        },
        function_preserving=all(a.function_preserving for a in alignments),
        anchor=anchor,
        alignments=alignments,
    )
