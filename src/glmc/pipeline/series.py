"""Connectivity along training: at every step of a series, the barrier per method between the paired
endpoints' weights at that step, and each one's own test loss. A series is either

- `train.save_steps` (endpoints=trained): snapshots taken while training (glmc.train.snapshots), beside the
  endpoints in the cache, so a rerun trains nothing; an endpoint cached before its snapshots were asked for
  is trained once more for them (its cached weights stay what they were); or
- `endpoints.paths` of one list of checkpoint folders per endpoint (endpoints=pretrained): position i of
  every list is step i, numbered by the number the folders' names end in (step1000) where they agree.

results.json's `series` holds the steps and, per step (a string key), per method: the mean barrier over the
pairs, its standard error and each pair's barrier; series.png draws them with the endpoints' losses."""

from __future__ import annotations

import copy
import logging
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from glmc.choices import EvalPrecision
from glmc.config import Config
from glmc.eval.barrier_curves import plot_barrier_against
from glmc.eval.evaluator import Evaluator
from glmc.models.build import build_model
from glmc.models.convert import to_canonical
from glmc.pipeline.cache import EndpointCache
from glmc.pipeline.endpoint_record import Endpoint
from glmc.pipeline.endpoints import cache_key, endpoint_config, load_endpoints, pretrained_model, train_endpoint
from glmc.pipeline.matrix import write_matrices
from glmc.train.snapshots import load_snapshot, missing_steps, planned_steps, recorded_total, snapshot_dir

log = logging.getLogger(__name__)

# (endpoints at one step, their own losses or None, the step's folder) -> method -> that method's summary
Measure = Callable[[list[Endpoint], "list[float] | None", Path], dict[str, Any]]
Load = Callable[[int], list[Endpoint]]  # a step -> the endpoints at that step, measured on the test split
LAST_NUMBER = re.compile(r"(\d+)(?!.*\d)")  # "step1000" -> 1000: a checkpoint folder's step


def folder_series_configs(cfg: Config) -> tuple[list[Config], list[str]]:
    """A series of folders (endpoints=pretrained, endpoints.paths a list of checkpoint folders per endpoint:
    position i of every list is step i): one config per step whose endpoints.paths are that step's
    folders. [cfg] for anything else; the problems of the lists' shape, if any (then [cfg])."""
    paths = list(cfg.endpoints.paths) if str(cfg.endpoints.source) == "pretrained" else []
    is_list = [OmegaConf.is_list(p) or isinstance(p, list) for p in paths]
    if not any(is_list):
        return [cfg], []
    problems = []
    if not all(is_list):
        i, j = is_list.index(False), is_list.index(True)
        problems.append(
            f"endpoints.paths[{i}]={paths[i]} is one folder, endpoints.paths[{j}] a list: a series gives every "
            "endpoint a list of checkpoint folders (one per step); give lists throughout or folders throughout"
        )
    lists = [list(p) for p, listed in zip(paths, is_list) if listed]
    lengths = [len(p) for p in lists]
    if all(is_list) and (len(set(lengths)) > 1 or 0 in lengths):
        problems.append(
            f"endpoints.paths: lists of {lengths} folders: position i of every list is step i, so give every "
            "endpoint a list of the same length (at least one folder)"
        )
    nested = [f"endpoints.paths[{i}]" for i, p in enumerate(lists) if any(OmegaConf.is_config(f) for f in p)]
    if nested:
        problems.append(f"{nested[0]}: holds a list or mapping; a series lists folders, one per step")
    if str(cfg.pairing) == "universe":
        problems.append(
            "endpoints.paths: a series of folders is measured pair by pair; use pairing=all, disjoint or first"
        )
    if problems:
        return [cfg], problems
    configs = []
    for position in range(lengths[0]):
        own = copy.deepcopy(cfg)
        own.endpoints.paths = [str(p[position]) for p in lists]
        configs.append(own)
    return configs, []


def folder_steps(configs: list[Config]) -> list[int]:
    """Each position's step: the number its folders' names end in where every folder of the position
    names the same one and they increase (step1000, step2000, ...), else the positions 0, 1, 2, ..."""
    found = []
    for c in configs:
        numbers = {LAST_NUMBER.search(Path(str(p)).name) for p in c.endpoints.paths}
        values = {int(m.group(1)) for m in numbers if m is not None}
        found.append(values.pop() if len(values) == 1 and None not in numbers else None)
    increasing = None not in found and all(a < b for a, b in zip(found, found[1:]))
    return found if increasing else list(range(len(configs)))


def series_problems(cfg: Config) -> list[str]:
    """What a `train.save_steps` setting cannot do: its form, and settings whose endpoint is not the last step."""
    steps = OmegaConf.select(cfg, "train.save_steps")
    if steps is None:
        return []
    key = f"train.save_steps={steps}"
    values = steps if OmegaConf.is_list(steps) or isinstance(steps, list) else [steps]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return [f"{key}: give an int N (every N optimizer steps) or a list of steps, e.g. train.save_steps=[0,10,50]"]
    if not OmegaConf.is_list(steps) and not isinstance(steps, list) and steps < 1:
        return [f"{key}: save every N >= 1 optimizer steps, or null for no snapshots"]
    problems = []
    if any(v < 0 for v in values) or len(set(values)) < len(values) or not values:
        problems.append(f"{key}: list one or more distinct steps >= 0, e.g. train.save_steps=[0,10,50]")
    if str(cfg.endpoints.source) != "trained":
        problems.append(f"{key}: snapshots are taken while endpoints=trained trains (leave train.save_steps=null)")
    if cfg.train.early_stopping_patience is not None:
        problems.append(
            f"{key}: with early stopping the endpoint is the best epoch's, not the last step's; set "
            "train.early_stopping_patience=null, or train.save_steps=null"
        )
    if str(cfg.pairing) == "universe":
        problems.append(f"{key}: the barrier per step is measured between pairs; use pairing=disjoint, all or first")
    return problems


def snapshot_folders(cfg: Config, run_dir: Path, tracker: Any) -> tuple[list[Path], list[int]]:
    """Each endpoint's snapshot folder, holding every planned step, and the steps. An endpoint cached
    without them is trained again for them, into the same folder (its cache entry is not touched)."""
    cache, folders, totals = EndpointCache(Path(cfg.cache_dir)), [], set()
    for index, seed in enumerate(cfg.seeds):
        own = endpoint_config(cfg, index)
        key = cache_key(own)
        folder = snapshot_dir(cache.entry(key, seed).parent, seed)
        with cache.lock(key, seed):
            if missing_steps(folder, cfg.train.save_steps) != []:
                log.info("seed %d: training again for its snapshots at train.save_steps (into %s)", seed, folder)
                start = pretrained_model(cfg, run_dir, tracker) if cfg.pretrain.enabled else None
                logger = tracker.lightning_logger(f"seed_{seed}_steps", "train")
                training = cache.training_dir(key, seed)
                train_endpoint(own, seed, run_dir, logger, checkpoint_dir=training, start_from=start)
                shutil.rmtree(training, ignore_errors=True)
        folders.append(folder)
        totals.add(recorded_total(folder))
    if len(totals) != 1:
        raise ValueError(
            f"train.save_steps: the endpoints trained for different numbers of steps ({sorted(totals)}), so "
            "their steps do not pair; give every endpoint the same data and train settings"
        )
    return folders, planned_steps(cfg.train.save_steps, totals.pop())


def snapshot_loader(cfg: Config, endpoints: list[Endpoint], folders: list[Path], test: Evaluator, last: int) -> Load:
    """Loads the snapshots of one step (by its value) as endpoints, each measured on the test split; warns
    where the `last` step's is not the cached endpoint (snapshots trained again on a non-deterministic device)."""

    def load(step: int) -> list[Endpoint]:
        at_step = []
        for index, (e, folder) in enumerate(zip(endpoints, folders)):
            model = load_snapshot(build_model(endpoint_config(cfg, index).model), folder, step)
            ours, cached = model.state_dict(), e.model.state_dict()
            if step == last and not all(torch.equal(ours[k], cached[k].cpu()) for k in ours):
                log.warning("seed %d: the snapshot of the last step differs from the cached endpoint", e.seed)
            loss, accuracy = test.evaluate(model)
            accuracy = accuracy if cfg.data.task == "classification" else None
            at_step.append(Endpoint(e.seed, model, to_canonical(model), loss, accuracy, True))
        return at_step

    return load


def run_series(
    cfg: Config,
    configs: list[Config],
    run_dir: Path,
    tracker: Any,
    endpoints: list[Endpoint],
    evaluators: tuple[Evaluator, Evaluator],
    measure: Measure,
) -> dict[str, Any]:
    """results["series"] of a run with train.save_steps (its snapshots) or of a series of folders
    (`configs`: one per step, from folder_series_configs)."""
    test = evaluators[0]
    if len(configs) > 1:
        steps = folder_steps(configs)
        by_step = dict(zip(steps, configs))
        load: Load = lambda step: load_endpoints(by_step[step], test)  # noqa: E731
    else:
        folders, steps = snapshot_folders(cfg, run_dir, tracker)
        load = snapshot_loader(cfg, endpoints, folders, test, steps[-1])
    labels = [e.label for e in endpoints]
    if len(set(labels)) < len(labels):  # folders of one name in different places: their positions
        labels = [str(i) for i in range(len(endpoints))]
    return measure_series(cfg, labels, steps, load, evaluators, measure)


def measure_series(
    cfg: Config,
    labels: list[str],
    steps: list[int],
    load: Load,
    evaluators: tuple[Evaluator, Evaluator],
    measure: Measure,
) -> dict[str, Any]:
    """results["series"]: per step, every method's barriers between the endpoints `load` gives for it, and
    their test losses (and accuracies) under `labels`. `evaluators`: the test split's and the paths'."""
    test, evaluator = evaluators
    barrier: dict[str, dict[str, Any]] = {}
    se: dict[str, dict[str, Any]] = {}
    pairs: dict[str, dict[str, list[float]]] = {}
    losses: dict[str, list[float]] = {label: [] for label in labels}
    accuracies: dict[str, list[float | None]] = {label: [] for label in labels}
    for step in steps:
        at_step = load(step)
        for label, e in zip(labels, at_step):
            losses[label].append(e.test_loss)
            accuracies[label].append(e.test_accuracy if cfg.data.task == "classification" else None)
        own = None  # as the run checks its endpoints' paths: where each must end, in full precision
        if cfg.eval.precision == EvalPrecision.full:
            own = [e.test_loss if evaluator is test else evaluator.evaluate(e.model)[0] for e in at_step]
        methods = measure(at_step, own, Path(f"series/step_{step}"))
        barrier[str(step)] = {m: s["barrier"] for m, s in methods.items()}
        se[str(step)] = {m: s["barrier_se"] for m, s in methods.items()}
        pairs[str(step)] = {m: [p["barrier"] for p in s["pairs"]] for m, s in methods.items()}
        log.info("step %d: %s", step, ", ".join(f"{m} barrier {b:.4f}" for m, b in barrier[str(step)].items()))
    return {
        "steps": steps,
        "source": "train.save_steps" if cfg.train.save_steps is not None else "endpoints.paths",
        "barrier": barrier,
        "barrier_se": se,
        "pair_barriers": pairs,
        "endpoint_loss": losses,
        "endpoint_accuracy": accuracies,
    }


def plot_series(series: dict[str, Any], path: Path, title: str) -> Path:
    """series.png: every method's barrier against the training step (mean ± s.e. over pairs), with the
    snapshots' losses."""
    steps = series["steps"]
    methods = list(series["barrier"][str(steps[0])])
    rows = {
        m: [list(r) for r in zip(*(series["pair_barriers"][str(s)][m] for s in steps))] for m in methods
    }  # one row per pair
    losses = {"endpoint loss": list(series["endpoint_loss"].values())}
    xlabel = "training step (optimizer steps)" if series["source"] == "train.save_steps" else "checkpoint step"
    return plot_barrier_against(path, steps, rows, losses, xlabel=xlabel, title=title)


def series_lines(series: dict[str, Any]) -> dict[str, list[float | None]]:
    """Every method's mean barrier per step, and the mean endpoint loss per step, as lines for a logger."""
    steps = [str(s) for s in series["steps"]]
    lines = {m: [series["barrier"][s][m] for s in steps] for m in series["barrier"][steps[0]]}
    per_endpoint = list(series["endpoint_loss"].values())
    lines["endpoint loss"] = [sum(v) / len(v) for v in zip(*per_endpoint)]
    return lines


def write_connectivity(results: dict[str, Any], run_dir: Path, tracker: Any) -> list[Path]:
    """series.png and the matrices' CSVs and matrix.png, where results hold them; with W&B, the barrier per
    step as line plots and both figures in the evaluate run (call after tracker.log_results)."""
    title = f"{results['model']} on {results['dataset']}"
    files = []
    if "series" in results:
        series = results["series"]
        files.append(plot_series(series, run_dir / "series.png", title))
        tracker.log_lines("series/barrier", series["steps"], series_lines(series), "training step")
        tracker.log_image("series/png", files[-1])
    if "matrix" in results:
        files += write_matrices(results["matrix"], run_dir, title)
        tracker.log_image("matrix/png", run_dir / "matrix.png")
    if files:
        log.info("wrote %s", ", ".join(str(f) for f in files))
    return files
