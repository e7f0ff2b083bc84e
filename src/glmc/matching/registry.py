"""Method name -> matcher, built from the run's config."""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable

from omegaconf import OmegaConf

from glmc.config import Config
from glmc.eval.barrier import lambda_grid
from glmc.matching.base import Matcher
from glmc.matching.canonical import CanonicalMatcher
from glmc.matching.learned import LearnedMatcher
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


def _learned(name: str, residual: str | None = None, units: str = "permutation"):
    def build(cfg: Config, ctx: MatchContext) -> LearnedMatcher:
        from glmc.pipeline.endpoints import make_trainer  # the endpoints' Trainer settings (late: no cycle)

        sym = cfg.symmetry
        kinds = {"residual": residual or sym.residual,
                 "heads": units if sym.heads != "none" else "none", "mlp": units if sym.mlp != "none" else "none"}
        settings = OmegaConf.to_object(cfg.matcher.learned)  # the LearnedMatchingConfig dataclass
        return LearnedMatcher(name, kinds, settings, cfg.data.task, circuits=sym.qk == "circuit",
                              make_trainer=partial(make_trainer, cfg), run_dir=ctx.run_dir,
                              logger_for=ctx.tracker.lightning_logger if ctx.tracker else None,
                              weight_iters=cfg.matcher.weight.max_iter, weight_tol=cfg.matcher.weight.tol,
                              lambdas=lambda_grid(cfg.eval.num_lambdas))
    return build


MATCHERS: dict[str, Callable[[Config, MatchContext], Matcher]] = {
    "vanilla": lambda cfg, ctx: VanillaMatcher(),
    "canonical": lambda cfg, ctx: CanonicalMatcher(circuits=cfg.symmetry.qk == "circuit"),
    "weight": _weight("weight"),
    "weight_perm": _weight("weight_perm", residual="permutation"),
    "learned": _learned("learned"),
    "learned_perm": _learned("learned_perm", residual="permutation"),
    "learned_sinkhorn": _learned("learned_sinkhorn", units="sinkhorn"),
}


def build_matcher(name: str, cfg: Config, context: MatchContext | None = None) -> Matcher:
    if name not in MATCHERS:
        raise ValueError(f"matcher.methods contains {name!r}, which is not one of {sorted(MATCHERS)}")
    return MATCHERS[name](cfg, context or MatchContext(run_dir=Path(".")))
