"""Reading run folders back: results.json of a run or of a grid's jobs, seed pairs pooled across runs,
and means with standard errors over pairs."""

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


def grid_jobs(folder: Path) -> list[Path]:
    """The job folders of a multirun grid (0/, 1/, ...), in job order."""
    jobs = sorted((p for p in Path(folder).iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
    if not jobs:
        raise FileNotFoundError(f"{folder} holds no job folders (0/, 1/, ...): the grid has not run")
    return jobs


def grid_results(folder: Path) -> list[dict[str, Any]]:
    """results.json of every job of a multirun grid, in job order."""
    return [run_results(job) for job in grid_jobs(folder)]


# keys pooled over rather than told apart: seed pairs are the samples of a row
POOLED_KEYS = ("seeds",)


def flat_config(node: Any, prefix: str = "") -> dict[str, Any]:
    """`{"a.b": value}` for every leaf of a nested config (lists are leaves)."""
    if not isinstance(node, dict):
        return {prefix[:-1]: node}
    out: dict[str, Any] = {}
    for key, value in node.items():
        out.update(flat_config(value, f"{prefix}{key}."))
    return out


def _method_settings(results: dict[str, Any], method: str) -> dict[str, str]:
    """The config that produced `method`'s numbers: others' matcher settings, seeds and no-number keys left out."""
    from glmc.pipeline.run_folder import NOT_RESULTS  # keys that change no number never split a row

    own = f"matcher.{method}."
    unsplit = POOLED_KEYS + NOT_RESULTS + ("matcher.methods",)
    settings = {}
    for key, value in flat_config(results.get("config") or {}).items():
        others = key.startswith("matcher.") and not key.startswith(own)
        if not others and not any(key == k or key.startswith(k + ".") for k in unsplit):
            settings[key] = json.dumps(value)
    return settings


def _label(settings: dict[str, str], keys: list[str]) -> str:
    return ", ".join(f"{k}={json.loads(settings[k]) if k in settings else '<absent>'}" for k in keys)


@dataclass
class Collected:
    """What collect_runs found below a folder: the pooled seed pairs, the spawn runs (path, results), and one
    line per results.json left out of the table, saying why."""

    pooled: dict[tuple[str, str, str, str, str, str], list[dict]]
    spawn: list[tuple[Path, dict[str, Any]]]
    skipped: list[str]


def collect(root: Path) -> dict[tuple[str, str, str, str, str, str], list[dict]]:
    """Seed pairs per (experiment, model, dataset, method, shared settings, method settings) below `root`; the
    settings name the config keys that differ between runs, so a grid's runs are never pooled."""
    return collect_runs(root).pooled


def _read_run(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(results.json's record, None), or (None, why it cannot be pooled): one broken file skips one run
    (named by its path below the folder given)."""
    try:
        results = json.loads(path.read_text())
    except (OSError, ValueError) as err:  # ValueError: cut short while written, or not text
        cut = "a file cut short (a run stopped while writing it)"
        return None, f"{path}: cannot be read ({err}); {cut}: run that job again"
    if not isinstance(results, dict):
        return None, f"{path}: not a JSON object, so not a glmc results.json; remove it or run the job again"
    missing = [k for k in ("experiment", "model", "dataset", "methods") if k not in results]
    if missing:
        return None, f"{path}: lacks {', '.join(missing)}, so not a glmc results.json; remove it or run the job again"
    return results, None


def collect_runs(root: Path) -> Collected:
    """collect's pooled pairs, plus the spawn runs (their barriers are per spawn step, not per seed pair) and
    a line for every results.json that holds no pairs (endpoints=finetuned) or cannot be read."""
    files = sorted(Path(root).rglob("results.json"))
    if not files:
        raise FileNotFoundError(f"no results.json under {root}")
    runs, spawn, skipped = [], [], []  # runs: (row without settings, its settings, its pairs)
    for path in files:
        results, problem = _read_run(path)
        if problem:
            skipped.append(problem)
        elif "spawn" in results:
            spawn.append((path, results))
        elif "children" in results and not results["methods"]:
            skipped.append(f"{path}: endpoints=finetuned, whose pairs are under `children`, not seed pairs")
        for method, m in (results or {}).get("methods", {}).items():
            row = (results["experiment"], results["model"], results["dataset"], method)
            runs.append((row, _method_settings(results, method), m.get("pairs") or [m]))
    values: dict[tuple, dict[str, set]] = defaultdict(lambda: defaultdict(set))
    for row, settings, _ in runs:
        for key in set(settings) | set(values[row]):
            values[row][key].add(settings.get(key, "<absent>"))
    pooled: dict[tuple, dict] = defaultdict(dict)
    for row, settings, pairs in runs:
        differing = sorted(k for k, seen in values[row].items() if len(seen) > 1)
        shared = _label(settings, [k for k in differing if not k.startswith("matcher.")])
        own = _label(settings, [k for k in differing if k.startswith("matcher.")])
        for pair in pairs:
            pooled[(*row, shared, own)][tuple(pair.get("seeds", ()))] = pair
    return Collected({key: list(pairs.values()) for key, pairs in pooled.items()}, spawn, skipped)


def unfinished_jobs(root: Path) -> list[str]:
    """Run folders below `root` that Hydra started but that wrote no results.json, with the reason."""
    from glmc.pipeline.sweep_report import FAILED_FILE

    lines = []
    for hydra_dir in sorted(Path(root).rglob(".hydra")):
        job = hydra_dir.parent
        if (job / "results.json").is_file():
            continue
        try:
            reason = "failed: " + json.loads((job / FAILED_FILE).read_text())["message"]
        except (OSError, ValueError, KeyError, TypeError):
            reason = "no results.json (still running, or stopped before it finished)"
        lines.append(f"{job.relative_to(root) if job != Path(root) else job}: {reason}")
    return lines


@dataclass(frozen=True)
class Curve:
    """One metric against lambda: the mean over seed pairs, its s.e. (None for one pair), a colour group."""

    lambdas: list[float]
    mean: np.ndarray
    se: np.ndarray | None
    label: str = ""
    group: str = ""


def curve(pairs: list[dict[str, Any]], key: str, label: str = "", group: str = "", scale: float = 1.0) -> Curve:
    """Mean and s.e. of `pairs[i][key]` at every lambda (no band for a single pair)."""
    from glmc.eval.bands import mean_spread  # plotting module: loaded only where curves are drawn

    mean, se = mean_spread([p[key] for p in pairs], "se")
    return Curve(list(pairs[0]["lambdas"]), mean * scale, se * scale if len(pairs) > 1 else None, label, group)


def second_metric(task: str) -> tuple[str, str, float]:
    """The curve beside the loss: (pair key, axis label, scale); perplexity for language models."""
    if is_token_task(task):
        return "test_perplexity", "test perplexity", 1.0
    return "test_accuracy", "test accuracy (%)", 100.0


def barrier_stats(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    """Barrier mean ± s.e. over pairs, the mean seconds a pair took to align, and the pair count."""
    barrier, se = mean_se([p["barrier"] for p in pairs])
    seconds = float(np.mean([p["seconds"] for p in pairs]))
    return {"pairs": len(pairs), "barrier": barrier, "barrier_se": se, "seconds": seconds}
