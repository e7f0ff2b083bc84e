"""Connectivity along training (`train.save_steps`): at every saved step, the barrier per method between the
snapshots the paired endpoints took at that step (glmc.train.snapshots), and each snapshot's own loss.

The snapshots sit beside the endpoints in the cache, so a rerun trains nothing; an endpoint cached before
its snapshots were asked for is trained once more for them (its cached weights stay what they were).
results.json's `series` holds, per step (a string key), per method: the mean barrier over the pairs, its
standard error and each pair's barrier; series.png draws them with the snapshots' losses."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from glmc.choices import EvalPrecision
from glmc.config import Config
from glmc.eval.barrier_curves import plot_barrier_against
from glmc.eval.evaluator import Evaluator
from glmc.models.build import build_model
from glmc.models.convert import to_canonical
from glmc.pipeline.cache import EndpointCache
from glmc.pipeline.endpoint_record import Endpoint
from glmc.pipeline.endpoints import cache_key, endpoint_config, pretrained_model, train_endpoint
from glmc.pipeline.matrix import write_matrices
from glmc.train.snapshots import load_snapshot, missing_steps, planned_steps, recorded_total, snapshot_dir

log = logging.getLogger(__name__)

# (endpoints at one step, their own losses or None, the step's folder) -> method -> that method's summary
Measure = Callable[[list[Endpoint], "list[float] | None", Path], dict[str, Any]]


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
        problems.append(f"{key}: list distinct steps >= 0, e.g. train.save_steps=[0,10,50]")
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


def measure_series(
    cfg: Config,
    endpoints: list[Endpoint],
    folders: list[Path],
    steps: list[int],
    evaluator: Evaluator,
    measure: Measure,
) -> dict[str, Any]:
    """results["series"]: per step, every method's barriers between the snapshots of that step."""
    barrier: dict[str, dict[str, Any]] = {}
    se: dict[str, dict[str, Any]] = {}
    pairs: dict[str, dict[str, list[float]]] = {}
    losses: dict[str, list[float]] = {e.label: [] for e in endpoints}
    accuracies: dict[str, list[float | None]] = {e.label: [] for e in endpoints}
    check_ends = cfg.eval.precision == EvalPrecision.full  # as the run checks its endpoints' paths
    for step in steps:
        at_step = []
        for index, (e, folder) in enumerate(zip(endpoints, folders)):
            model = load_snapshot(build_model(endpoint_config(cfg, index).model), folder, step)
            loss, accuracy = evaluator.evaluate(model)
            losses[e.label].append(loss)
            accuracies[e.label].append(accuracy if cfg.data.task == "classification" else None)
            at_step.append(Endpoint(e.seed, model, to_canonical(model), loss, accuracy, True))
        own = [x.test_loss for x in at_step] if check_ends else None
        methods = measure(at_step, own, Path(f"series/step_{step}"))
        barrier[str(step)] = {m: s["barrier"] for m, s in methods.items()}
        se[str(step)] = {m: s["barrier_se"] for m, s in methods.items()}
        pairs[str(step)] = {m: [p["barrier"] for p in s["pairs"]] for m, s in methods.items()}
        log.info("step %d: %s", step, ", ".join(f"{m} barrier {b:.4f}" for m, b in barrier[str(step)].items()))
    return {
        "steps": steps,
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
    return plot_barrier_against(path, steps, rows, losses, xlabel="training step (optimizer steps)", title=title)


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
    return files
