"""eval.tasks in a run: lm-evaluation-harness's tasks at both ends and every point of each method's path
(glmc.eval.tasks), in the pair's record under "tasks", a figure per pair (tasks_<pair>.png in the method's
folder); for the run, results["tasks"] (per method, the mean curve and barrier over pairs), tasks.png, the
columns `<task>/<metric>` of barrier.csv, a printed table and W&B lines."""

from __future__ import annotations

import logging
import math
import weakref
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from glmc.eval.tasks import TaskSuite, path_scores
from glmc.eval.tasks_plot import plot_task_curves

log = logging.getLogger(__name__)

# an endpoint model's task scores, by the suite's tasks, limit and window: a model is scored once however
# many pairs it is in, and another model (the same seed at another step of a series) never reads them
ENDPOINT_SCORES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def check_tasks(cfg: Any) -> TaskSuite | None:
    """The run's task suite (names checked, before any training), or None without eval.tasks."""
    if not cfg.eval.tasks:
        return None
    if str(cfg.data.task) != "causal_lm":
        raise ValueError(
            f"eval.tasks scores language models by lm-evaluation-harness, and data.task={cfg.data.task} is not "
            "causal_lm; run it with a language-model data set"
        )
    if cfg.eval.task_limit is not None and int(cfg.eval.task_limit) < 1:
        raise ValueError(f"eval.task_limit={cfg.eval.task_limit}: use at least 1 (or null: every example)")
    return _suite(
        tuple(map(str, cfg.eval.tasks)),
        str(Path(cfg.cache_dir) / "lm_eval_tasks"),
        cfg.eval.task_limit,
        int(cfg.eval.task_batch_size),
    )


@lru_cache(maxsize=2)
def _suite(names: tuple[str, ...], folder: str, limit: int | None, batch_size: int) -> TaskSuite:
    return TaskSuite(list(names), Path(folder), limit, batch_size)


def task_record(run: Any, name: str, label: str, alignment: Any, pair: tuple) -> dict[str, Any]:
    """Method `name`'s pair `label`: every task metric along its path, the ends' own scores, a figure."""
    suite = check_tasks(run.cfg)
    tokenizer, length = run.data.tokenizer, int(run.cfg.data.seq_len)
    record = path_scores(suite, alignment, run.lambdas, tokenizer, length, run.device, f"{name} {label} tasks")
    ends = {}
    for end, endpoint in zip(("A", "B"), pair):  # each endpoint's own model, scored once while it lives
        model, key = endpoint.model, (tuple(suite.specs), suite.limit, length)
        scored = ENDPOINT_SCORES.setdefault(model, {})
        if key not in scored:
            scored[key] = suite.score(model, tokenizer, length, run.device)
        ends[end] = scored[key]
    record["endpoints"] = ends
    folder = Path(run.run_dir) / name
    folder.mkdir(parents=True, exist_ok=True)
    panels = {f"{t}/{m}": {name: entry} for t, metrics in record["tasks"].items() for m, entry in metrics.items()}
    figure = plot_task_curves(folder / f"tasks_{label}.png", record["lambdas"], panels, f"{name} {label}: task scores")
    record["figure"] = str(figure.relative_to(run.run_dir))
    return record


def task_summary(results: dict[str, Any]) -> dict[str, Any]:
    """Method -> "<task>/<metric>" -> the mean curve over the method's pairs and lm-eval's mean standard error
    at each point, the mean barrier, its standard error over pairs (None for one pair) and the mean of
    lm-eval's standard errors of the barrier."""
    table: dict[str, Any] = {}
    for method, summary in results.get("methods", {}).items():
        records = [p["tasks"] for p in summary.get("pairs") or [summary] if p.get("tasks")]
        for record in records:
            for task, metrics in record["tasks"].items():
                for metric, entry in metrics.items():
                    cell = table.setdefault(method, {}).setdefault(f"{task}/{metric}", {"runs": []})
                    cell["runs"].append(entry)
                    cell["lambdas"] = record["lambdas"]
    for cells in table.values():
        for cell in cells.values():
            runs = cell.pop("runs")
            barriers = [r["barrier"] for r in runs]
            errors = [r["barrier_stderr"] for r in runs if r["barrier_stderr"] is not None]
            pointwise = [r["stderr"] for r in runs if all(s is not None for s in r["stderr"])]
            cell.update(
                values=np.mean([r["values"] for r in runs], axis=0).tolist(),
                stderr=np.mean(pointwise, axis=0).tolist() if len(pointwise) == len(runs) else None,
                barrier=float(np.mean(barriers)),
                barrier_se=float(np.std(barriers, ddof=1) / math.sqrt(len(runs))) if len(runs) > 1 else None,
                barrier_stderr=float(np.mean(errors)) if errors else None,
                higher_is_better=runs[0]["higher_is_better"],
                pairs=len(runs),
            )
    return table


def format_tasks(results: dict[str, Any]) -> str:
    """The printed table: one row per method and task metric, its barrier and the mid-point score."""
    table = results.get("tasks") or {}
    if not table:
        return ""
    header = f"{'method':<18}{'task/metric':<32}{'barrier':>18}{'mid':>8}"
    lines = ["", "task barriers (lm-evaluation-harness; ± lm-eval's standard error):", header, "-" * len(header)]
    for method, cells in table.items():
        for column, cell in cells.items():
            spread = f" ± {cell['barrier_stderr']:.3f}" if cell.get("barrier_stderr") is not None else ""
            mid = cell["values"][len(cell["values"]) // 2]
            lines.append(f"{method:<18}{column:<32}{cell['barrier']:>10.4f}{spread:>8}{mid:>8.3f}")
    return "\n".join(lines)


def write_tasks(results: dict[str, Any], run_dir: Path, tracker: Any) -> list[Path]:
    """tasks.png (a panel per task metric, the methods' mean curves) and W&B lines of the same."""
    table = results.get("tasks") or {}
    if not table:
        return []
    columns = list(dict.fromkeys(c for cells in table.values() for c in cells))
    lambdas = next(iter(next(iter(table.values())).values()))["lambdas"]
    panels = {c: {m: cells[c] for m, cells in table.items() if c in cells} for c in columns}
    title = f"{results.get('model', '')} on {results.get('dataset', '')}: task scores (mean over pairs)"
    figure = plot_task_curves(Path(run_dir) / "tasks.png", lambdas, panels, title)
    tracker.log_image("tasks/png", figure)
    for column, lines in panels.items():
        tracker.log_lines(f"tasks/{column}", lambdas, {m: c["values"] for m, c in lines.items()}, "lambda")
    log.info("wrote %s", figure)
    return [figure]
