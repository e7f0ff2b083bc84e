"""The task function: train (or load) endpoints -> align -> evaluate the path -> report."""
from __future__ import annotations

import json
import logging
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from glmc.config import Config
from glmc.data.module import DataModule
from glmc.eval.barrier import barrier, barrier_vs_mean, lambda_grid
from glmc.eval.path import evaluate_path
from glmc.matching.registry import MatchContext, build_matcher
from glmc.pipeline.endpoints import get_endpoints
from glmc.pipeline.report import format_table, write_results
from glmc.pipeline.tracking import Tracker

log = logging.getLogger(__name__)


def seed_pairs(seeds: list[int], pairing: str) -> list[tuple[int, int]]:
    """Index pairs (A, B). `disjoint` gives independent pairs (0,1),(2,3)... for a standard error."""
    n = len(seeds)
    if n < 2:
        raise ValueError(f"seeds={seeds}: at least two endpoints are needed")
    if pairing == "disjoint":
        if n % 2:
            raise ValueError(f"seeds={seeds}: pairing=disjoint needs an even number of seeds")
        return [(i, i + 1) for i in range(0, n, 2)]
    if pairing == "all":
        return [(i, j) for i in range(n) for j in range(i + 1, n)]
    raise ValueError(f"pairing={pairing!r} is not one of disjoint, all")


def summarise(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean curve and mean barrier over seed pairs (standard error when there are several)."""
    barriers = np.array([p["barrier"] for p in pairs])
    mean_curve = lambda key: [None if any(v is None for v in vals) else float(np.mean(vals))
                              for vals in zip(*(p[key] for p in pairs))]
    return {
        "barrier": float(barriers.mean()),
        "barrier_se": float(barriers.std(ddof=1) / np.sqrt(len(barriers))) if len(barriers) > 1 else None,
        "barrier_vs_mean": float(np.mean([p["barrier_vs_mean"] for p in pairs])),
        "lambdas": pairs[0]["lambdas"],
        "test_loss": mean_curve("test_loss"),
        "test_accuracy": mean_curve("test_accuracy"),
        "seconds": float(np.mean([p["seconds"] for p in pairs])),
        "pairs": pairs,
    }


def quiet_lightning() -> None:
    """Lightning's per-fit banners (device summary, tips) would drown the progress bars."""
    logging.getLogger("lightning.pytorch.utilities.rank_zero").setLevel(logging.WARNING)
    logging.getLogger("lightning.fabric.utilities.rank_zero").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
    warnings.filterwarnings("ignore", message=".*smaller than the logging interval.*")


def run_pipeline(cfg: Config, run_dir: Path) -> dict[str, Any]:
    quiet_lightning()
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    task = cfg.data.task
    pairs = seed_pairs(list(cfg.seeds), cfg.pairing)  # bad seeds or methods fail before any training
    lambdas = lambda_grid(cfg.eval.num_lambdas)
    with Tracker(cfg, run_dir) as tracker:
        matchers = {name: build_matcher(name, cfg, MatchContext(run_dir / name, tracker)) for name in cfg.matcher.methods}
        data = DataModule(cfg.data, seed=0)
        data.setup()
        test_loader = data.test_dataloader()
        endpoints = get_endpoints(cfg, run_dir, tracker, test_loader)
        methods: dict[str, Any] = {}
        for name, matcher in matchers.items():
            pair_results = []
            for ia, ib in pairs:
                a, b = endpoints[ia], endpoints[ib]
                start = time.perf_counter()
                alignment = matcher.match(a.model, b.model, data=data)
                seconds = time.perf_counter() - start
                curve = evaluate_path(alignment.reference, alignment.model, test_loader, lambdas, task,
                                      desc=f"{name} {a.seed}-{b.seed}", progress=cfg.trainer.enable_progress_bar)
                if alignment.diagnostics:  # e.g. weight matching's objective per iteration
                    diag_file = run_dir / name / f"diagnostics_{a.seed}-{b.seed}.json"
                    diag_file.parent.mkdir(parents=True, exist_ok=True)
                    diag_file.write_text(json.dumps(alignment.diagnostics, indent=2))
                pair_results.append({
                    "seeds": [a.seed, b.seed],
                    "barrier": barrier(lambdas, curve["loss"]),
                    "barrier_vs_mean": barrier_vs_mean(lambdas, curve["loss"]),
                    "lambdas": lambdas,
                    "test_loss": curve["loss"],
                    "test_accuracy": curve["accuracy"] if task == "classification" else [None] * len(lambdas),
                    "seconds": seconds,
                    "diagnostics": alignment.diagnostics,
                })
            methods[name] = summarise(pair_results)
            log.info("%s: barrier %.4f", name, methods[name]["barrier"])
        results = {
            "experiment": cfg.experiment,
            "model": cfg.model.name,
            "dataset": cfg.data.name,
            "endpoints": [
                {"seed": e.seed, "test_loss": e.test_loss,
                 "test_accuracy": e.test_accuracy if task == "classification" else None, "cached": e.cached}
                for e in endpoints
            ],
            "methods": methods,
            "config": OmegaConf.to_container(cfg, resolve=True),
        }
        write_results(results, run_dir)
        tracker.log_results(results)
    print(format_table(results))
    print(f"\nwrote {run_dir / 'results.json'}, barrier.csv, barrier.png")
    return results
