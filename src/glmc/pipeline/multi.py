"""Multi-model runs (`pairing=universe`, paper 001 §4.3): every endpoint aligned to a shared universe,
the loss over the simplex they span (Eq. 2), the pairwise barriers among the aligned models, and
one ternary heatmap per method for three models (Fig. 4). The methods are those of
glmc.matching.registry.MULTI_METHODS. Every multi.* setting is checked before any work by
glmc.pipeline.validate."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from glmc.config import Config
from glmc.eval.barrier import lambda_grid
from glmc.eval.evaluator import Evaluator
from glmc.eval.simplex import evaluate_simplex, pairwise_barriers, simplex_points
from glmc.eval.ternary import plot_simplex_heatmaps
from glmc.matching.base import MatchContext
from glmc.matching.registry import MULTI_METHODS, build_matcher, build_refinement, check_multi_methods, method_config
from glmc.matching.universe import universe_match
from glmc.pipeline.endpoint_record import Endpoint

log = logging.getLogger(__name__)


def run_multi(
    cfg: Config, run_dir: Path, endpoints: list[Endpoint], evaluator: Evaluator, context: MatchContext
) -> dict[str, Any]:
    """results["multi"]: per method the simplex table, its maximum (Eq. 2), the pairwise barriers
    among the aligned models, rounds and seconds; writes simplex.png for three models."""
    n = len(endpoints)
    points = simplex_points(n, cfg.multi.step, cfg.multi.samples, cfg.multi.seed)
    lambdas = lambda_grid(cfg.eval.num_lambdas)
    progress = cfg.trainer.enable_progress_bar
    out: dict[str, Any] = {}
    universe = None
    check_multi_methods(list(cfg.multi.methods))
    for method in cfg.multi.methods:
        start = time.perf_counter()
        info: dict[str, Any] = {}
        if not MULTI_METHODS[method].universe:
            models, circuits = [e.model for e in endpoints], ()
        else:
            if universe is None:  # every universe method shares one universe (refinements start there)
                pairwise = build_matcher(method_config(cfg, cfg.multi.pairwise))
                universe = universe_match(
                    [e.canonical for e in endpoints], pairwise, context, cfg.multi.max_rounds, cfg.multi.tol
                )
                universe_seconds = time.perf_counter() - start
            aligned = universe
            refine = build_refinement(method, cfg.multi)
            if refine is not None:
                aligned = refine(universe, context)
            models, circuits = aligned.models, tuple(aligned.circuits)
            info = {k: v for k, v in aligned.diagnostics.items() if k != "history"}
            info["universe_seconds"] = universe_seconds
        seconds = time.perf_counter() - start + info.get("seconds_before_resume", 0.0)  # a resumed refinement's total
        table = evaluate_simplex(evaluator, models, points, circuits, progress=progress)
        pairs = pairwise_barriers(evaluator, models, circuits, lambdas)
        out[method] = {
            **table,
            "pairwise_barriers": {f"{endpoints[i].label}-{endpoints[j].label}": b for (i, j), b in pairs.items()},
            "seconds": seconds,
            "diagnostics": info,
        }
        log.info("%s: multi-model barrier %.4f over %d points", method, table["barrier"], len(points))
    if n == 3:
        plot_simplex_heatmaps(
            out,
            run_dir / "simplex.png",
            title=f"{model_name(cfg, endpoints)} on {cfg.data.name}: test loss above the linear baseline",
            labels=[f"seed {e.seed}" if e.name is None else e.name for e in endpoints],
        )
    return out


def model_name(cfg: Config, endpoints: list[Endpoint]) -> str:
    """model.name, or for endpoints=pretrained the family and the folders' names."""
    if endpoints and endpoints[0].name is not None:
        return f"{endpoints[0].canonical.config.family} ({', '.join(e.label for e in endpoints)})"
    return cfg.model.name


def format_multi(multi: dict[str, Any]) -> str:
    lines = ["", "multi-model (Eq. 2: max over the simplex of the loss above the linear baseline):"]
    header = f"{'method':<10}{'barrier':>10}{'at':>22}{'pairwise barriers':>40}{'seconds':>9}"
    lines += [header, "-" * len(header)]
    for name, m in multi.items():
        at = "(" + ", ".join(f"{a:.2f}" for a in m["argmax"]) + ")"
        pairs = ", ".join(f"{k}: {v:.3f}" for k, v in m["pairwise_barriers"].items())
        lines.append(f"{name:<10}{m['barrier']:>10.4f}{at:>22}{pairs:>40}{m['seconds']:>9.1f}")
    return "\n".join(lines)
