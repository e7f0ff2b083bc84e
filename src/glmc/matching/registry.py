"""Method name -> matcher, built from the run's config."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from glmc.config import Config
from glmc.matching.base import Matcher
from glmc.matching.canonical import CanonicalMatcher
from glmc.matching.vanilla import VanillaMatcher
from glmc.matching.weight import WeightMatcher


@dataclass
class MatchContext:
    """What a matcher may need beyond its settings: where to write, and how to log."""

    run_dir: Path
    tracker: Any = None  # glmc.pipeline.tracking.Tracker (Lightning loggers for learned matching)


def _weight(name: str, residual: str | None = None):
    def build(cfg: Config, ctx: MatchContext) -> WeightMatcher:
        sym, wm = cfg.symmetry, cfg.matcher.weight
        return WeightMatcher(name, residual or sym.residual, heads=sym.heads != "none", mlp=sym.mlp != "none",
                             circuits=sym.qk == "circuit", max_iter=wm.max_iter, tol=wm.tol)
    return build


MATCHERS: dict[str, Callable[[Config, MatchContext], Matcher]] = {
    "vanilla": lambda cfg, ctx: VanillaMatcher(),
    "canonical": lambda cfg, ctx: CanonicalMatcher(circuits=cfg.symmetry.qk == "circuit"),
    "weight": _weight("weight"),
    "weight_perm": _weight("weight_perm", residual="permutation"),
}


def build_matcher(name: str, cfg: Config, context: MatchContext | None = None) -> Matcher:
    if name not in MATCHERS:
        raise ValueError(f"matcher.methods contains {name!r}, which is not one of {sorted(MATCHERS)}")
    return MATCHERS[name](cfg, context or MatchContext(run_dir=Path(".")))
