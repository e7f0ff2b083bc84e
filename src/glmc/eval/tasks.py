"""Task scores along a path (eval.tasks): lm-evaluation-harness's tasks run on each point in memory
(glmc.eval.task_lm.ModelLM), and each task metric's barrier beside the loss barrier.

A task is a name lm-eval knows (hellaswag, arc_easy, ...: lm-eval downloads its data as usual), one of
the two tasks glmc ships (glmc.data.lm_eval_tasks: local files, no network) or a task YAML file. Names are
checked when the suite is built, before any training; lm-eval's index of its own tasks (several seconds to
build) is read only when a name is neither shipped nor a file.

The barrier of a score that should be high is the largest drop of the path's score below the straight
line between its end scores (for a score that should be low, the largest rise above it): the loss
barrier's rule with the sign turned. Its standard error combines lm-eval's standard errors of the three
scores it is made of (the point's and the two ends', as independent samples of the task's examples)."""

from __future__ import annotations

import contextlib
import difflib
import functools
import logging
import math
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from glmc.alignment import Alignment
from glmc.data.lm_eval_tasks import SHIPPED, write_shipped_tasks

log = logging.getLogger(__name__)

YAML_SUFFIXES = (".yaml", ".yml")


def _lm_eval():
    try:
        import lm_eval  # noqa: F401
    except ImportError as err:
        raise ImportError(
            "eval.tasks needs lm-evaluation-harness (the lm-eval package, with its hf extra): `make setup` installs it"
        ) from err


@lru_cache(maxsize=4)
def _manager(folder: str, defaults: bool):
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=folder, include_defaults=defaults, verbosity="ERROR")


def resolve_tasks(names: list[str], folder: Path, key: str = "eval.tasks"):
    """(lm-eval TaskManager, specs): each name checked; a YAML file must exist and define a task or group,
    any other name must be shipped or known to lm-eval. `folder`: where the shipped tasks are written."""
    _lm_eval()
    from lm_eval.tasks._index import TaskIndex

    if not names:
        raise ValueError(f"{key} is empty: name at least one task")
    specs, others = [], []
    for i, name in enumerate(map(str, names)):
        if name.endswith(YAML_SUFFIXES):
            path = Path(name).expanduser()
            if not path.is_file():
                raise FileNotFoundError(f"{key}[{i}]={name}: no such task file")
            if TaskIndex.entry_from_path(path.resolve()) is None:
                raise ValueError(f"{key}[{i}]={name}: the file defines no lm-eval task or group (no `task:` key)")
            specs.append(str(path.resolve()))
        else:
            specs.append(name)
            if name not in SHIPPED:
                others.append(name)
    write_shipped_tasks(folder)
    manager = _manager(str(folder), bool(others))
    known = set(manager.all_tasks)
    unknown = [name for name in others if name not in known]
    if unknown:
        hints = [difflib.get_close_matches(name, list(known), n=3) for name in unknown]
        said = "; ".join(f"{n!r}" + (f" (did you mean {', '.join(h)}?)" if h else "") for n, h in zip(unknown, hints))
        raise ValueError(
            f"{key}: lm-eval knows no task {said}; name a task lm-eval lists (`lm_eval ls tasks`), one of glmc's "
            f"own ({', '.join(SHIPPED)}) or a task YAML file"
        )
    return manager, specs


class TaskSuite:
    """The tasks of `names`, loaded once (their documents and requests' templates) and scored on any
    number of models. `limit`: at most this many examples per task (lm-eval's --limit)."""

    def __init__(self, names: list[str], folder: Path, limit: int | None = None, batch_size: int = 32):
        self.manager, self.specs = resolve_tasks(list(names), Path(folder))
        self.limit, self.batch_size = limit, batch_size
        self._loaded: dict | None = None

    def loaded(self) -> dict:
        if self._loaded is None:
            self._loaded = self.manager.load(self.specs)
        return self._loaded

    def score(self, model: torch.nn.Module, tokenizer: Any, max_length: int, device="cpu") -> dict[str, Any]:
        """{task: {metric: {"value", "stderr", "higher_is_better"}}} of one model."""
        from lm_eval import evaluator

        from glmc.eval.task_lm import ModelLM

        lm = ModelLM(model, tokenizer, max_length, self.batch_size, device)
        with _quiet_lm_eval():
            out = evaluator.evaluate(
                lm, self.loaded(), limit=self.limit, bootstrap_iters=1000, log_samples=False, verbosity="ERROR"
            )
        return scores_of(out)


@contextlib.contextmanager
def _quiet_lm_eval():
    """lm-eval's info lines and per-task progress bars off while a path's points are scored (a run prints
    one line per point instead): its loggers at WARNING, its task module's tqdm disabled."""
    import lm_eval.api.task as task_module

    logger = logging.getLogger("lm_eval")
    level, bar = logger.level, task_module.tqdm
    logger.setLevel(logging.WARNING)
    task_module.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        logger.setLevel(level)
        task_module.tqdm = bar


def scores_of(out: dict[str, Any]) -> dict[str, Any]:
    """lm-eval's results ({"acc,none": v, "acc_stderr,none": s}) as {task: {metric: {...}}}."""
    scores: dict[str, Any] = {}
    for task, values in out["results"].items():
        better = out.get("higher_is_better", {}).get(task, {})
        for field, value in values.items():
            if "," not in field or "_stderr," in field or not isinstance(value, (int, float)):
                continue
            metric, kind = field.split(",", 1)
            stderr = values.get(f"{metric}_stderr,{kind}")
            name = metric if kind == "none" else f"{metric},{kind}"
            scores.setdefault(task, {})[name] = {
                "value": float(value),
                "stderr": float(stderr) if isinstance(stderr, (int, float)) else None,
                "higher_is_better": bool(better.get(metric, True)),
            }
    return scores


def task_barrier(lambdas: list[float], values: list[float], stderrs: list, higher_is_better: bool) -> dict[str, Any]:
    """The barrier of one task metric along a path whose lambda = 1 is A, and its standard error."""
    lam = np.asarray(lambdas, dtype=float)
    y = np.asarray(values, dtype=float)
    a, b = y[int(np.argmax(lam))], y[int(np.argmin(lam))]
    line = lam * a + (1 - lam) * b
    gap = (line - y) if higher_is_better else (y - line)
    k = int(np.argmax(gap))
    se = list(stderrs)
    stderr = None
    if all(s is not None for s in se):
        parts = [se[k], lam[k] * se[int(np.argmax(lam))], (1 - lam[k]) * se[int(np.argmin(lam))]]
        stderr = math.sqrt(sum(p * p for p in parts))
    return {"barrier": float(gap[k]), "barrier_stderr": stderr, "at_lambda": float(lam[k])}


def path_scores(
    suite: TaskSuite,
    alignment: Alignment,
    lambdas: list[float],
    tokenizer: Any,
    max_length: int,
    device="cpu",
    desc: str = "tasks",
    progress: bool = True,
) -> dict[str, Any]:
    """Every task metric's curve along lam * A + (1 - lam) * aligned B (each point the alignment's own
    interpolation: circuits stay circuits), with standard errors and barriers."""
    curves: dict[str, dict[str, Any]] = {}
    for lam in tqdm(lambdas, desc=desc, disable=not progress, leave=False):
        point = alignment.interpolate(lam)
        for task, metrics in suite.score(point, tokenizer, max_length, device).items():
            for metric, s in metrics.items():
                entry = curves.setdefault(task, {}).setdefault(
                    metric, {"values": [], "stderr": [], "higher_is_better": s["higher_is_better"]}
                )
                entry["values"].append(s["value"])
                entry["stderr"].append(s["stderr"])
        del point
    for metrics in curves.values():
        for entry in metrics.values():
            entry.update(task_barrier(lambdas, entry["values"], entry["stderr"], entry["higher_is_better"]))
    return {"lambdas": list(lambdas), "tasks": curves}
