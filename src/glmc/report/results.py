"""Reading run folders back: results.json of a single run or of every job of a grid, seed pairs
pooled across runs, and means with standard errors over pairs (barriers and whole curves)."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from glmc.metrics import is_token_task


def mean_se(values: list[float]) -> tuple[float, float | None]:
    """Mean and standard error of the mean (None for a single value: no spread to estimate)."""
    arr = np.asarray(values, float)
    return float(arr.mean()), (float(arr.std(ddof=1) / np.sqrt(len(arr))) if len(arr) > 1 else None)


def run_results(folder: Path) -> dict[str, Any]:
    """results.json of a single run; the error names the folder, so a missing step is easy to find."""
    path = Path(folder) / "results.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the run in {folder} has not finished")
    return json.loads(path.read_text())


def grid_results(folder: Path) -> list[dict[str, Any]]:
    """results.json of every job of a multirun grid (job folders named by number), in job order."""
    jobs = sorted((p for p in Path(folder).iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
    if not jobs:
        raise FileNotFoundError(f"{folder} holds no job folders (0/, 1/, ...): the grid has not run")
    return [run_results(job) for job in jobs]


def collect(root: Path) -> dict[tuple[str, str, str, str], list[dict]]:
    """Seed pairs per (experiment, model, dataset, method) from every results.json below `root`;
    a pair seen in several runs counts once (the later file wins)."""
    pooled: dict[tuple[str, str, str, str], dict] = defaultdict(dict)
    files = sorted(Path(root).rglob("results.json"))
    if not files:
        raise FileNotFoundError(f"no results.json under {root}")
    for path in files:
        results = json.loads(path.read_text())
        for method, m in results["methods"].items():
            key = (results["experiment"], results["model"], results["dataset"], method)
            for pair in m.get("pairs") or [m]:
                pooled[key][tuple(pair.get("seeds", ()))] = pair
    return {key: list(pairs.values()) for key, pairs in pooled.items()}


@dataclass(frozen=True)
class Curve:
    """One metric against lambda over several seed pairs: the pointwise mean and its standard error
    (None with a single pair). `label` names the line, `group` picks its colour (e.g. the method)."""

    lambdas: list[float]
    mean: np.ndarray
    se: np.ndarray | None
    label: str = ""
    group: str = ""


def curve(pairs: list[dict[str, Any]], key: str, label: str = "", group: str = "", scale: float = 1.0) -> Curve:
    """Mean and s.e. of `pairs[i][key]` at every lambda (no band for a single pair)."""
    from glmc.report.bands import mean_spread  # plotting module: loaded only where curves are drawn

    mean, se = mean_spread([p[key] for p in pairs], "se")
    return Curve(list(pairs[0]["lambdas"]), mean * scale, se * scale if len(pairs) > 1 else None, label, group)


def second_metric(task: str) -> tuple[str, str, float]:
    """The curve beside the loss: (pair key, axis label, scale). Language models have no accuracy,
    so they show perplexity (the pipeline stores it per pair as test_perplexity)."""
    if is_token_task(task):
        return "test_perplexity", "test perplexity", 1.0
    return "test_accuracy", "test accuracy (%)", 100.0


def barrier_stats(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    """Barrier mean ± s.e. over pairs, the mean seconds a pair took to align, and the pair count."""
    barrier, se = mean_se([p["barrier"] for p in pairs])
    return {
        "pairs": len(pairs),
        "barrier": barrier,
        "barrier_se": se,
        "seconds": float(np.mean([p["seconds"] for p in pairs])),
    }
