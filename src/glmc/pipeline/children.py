"""Endpoints as children of one parent, one per seed of `seeds` in each group, each cached with the parent's
key in its own (`grow`); the parent is trained or read from the endpoint cache once, when the first child
needs it.

endpoints=finetuned: the parent is `pretrain`'s model and a group is a task of `endpoints.tasks` (overrides
of `data`). Pairs: same task (seeds differ) and cross-task (tasks differ, same seed). Each method of
matcher.methods aligns B to A; the aligned B and each variant merge with A at the midpoint (the average and
merge.kinds, each model's statistics on its own task's training batches), scored with each task's classifier
copied: the merged encoder with A's on A's test set, with aligned B's on B's (the mean of the two).

endpoints=spawn (instability analysis): the parent is trained from `seed_fixed` and its training state
(weights, AdamW moments, schedule position) kept at each step k of `endpoints.steps`; a group is one k, whose
children continue that state with their own data order (and dropout) to the parent's budget of optimizer
steps. The run's pairs of each group are measured as the pipeline measures endpoints (`run_spawn`)."""

from __future__ import annotations

import copy
import functools
import itertools
import logging
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf, open_dict

from glmc.choices import EvalPrecision
from glmc.config import Config
from glmc.data.module import DataModule
from glmc.eval.barrier_curves import plot_barrier_against
from glmc.eval.evaluator import Evaluator
from glmc.matching.registry import build_matcher, method_config
from glmc.matching.rotation import factored_distance
from glmc.models.build import build_model
from glmc.models.canonical import CanonicalTransformer, relative_deviation
from glmc.models.convert import to_canonical
from glmc.pipeline.cache import EndpointCache
from glmc.pipeline.endpoint_record import Endpoint
from glmc.pipeline.endpoints import (
    cache_key,
    divergence_hint,
    endpoint_seeds,
    load_or_train,
    pretrained_model,
    train_endpoint,
)
from glmc.pipeline.ensemble import ensemble_checkpoint, train_ensemble
from glmc.pipeline.merges import canonical_pair, own_data_merges, own_statistics
from glmc.pipeline.outputs import write_results
from glmc.pipeline.tracking import Tracker
from glmc.symmetry import Permutation, SignedPermutation
from glmc.train.endpoint import SpawnPoint, SpawnPoints
from glmc.train.resume import resumable

log = logging.getLogger(__name__)


def macro_f1(predicted, labels) -> float:
    """Per-class F1 = 2 TP / (2 TP + FP + FN), averaged over the classes that occur in the labels or
    the predictions; a class in neither has no defined F1 and is skipped."""
    predicted, labels = np.asarray(predicted).ravel(), np.asarray(labels).ravel()
    if predicted.shape != labels.shape or not len(labels):
        raise ValueError(f"macro_f1: {predicted.size} predictions for {labels.size} labels")
    classes = np.union1d(predicted, labels)[:, None]
    tp = ((predicted == classes) & (labels == classes)).sum(1)
    wrong = ((predicted == classes) != (labels == classes)).sum(1)  # false positives + false negatives
    return float(np.mean(2 * tp / (2 * tp + wrong)))


@torch.no_grad()
def classify(model: torch.nn.Module, batches: list) -> tuple[float, float]:
    """(macro-F1, accuracy) of the model's arg-max class on (inputs, labels) batches."""
    predicted = torch.cat([model(inputs).argmax(-1) for inputs, _ in batches]).numpy()
    labels = torch.cat([targets for _, targets in batches]).numpy()
    return macro_f1(predicted, labels), float(np.mean(predicted == labels))


def task_config(cfg: Config, task: int) -> Config:
    """The config of task `task`'s children: `data` with endpoints.tasks[task] merged in."""
    if not cfg.pretrain.enabled or not cfg.endpoints.tasks or cfg.data.task != "classification":
        raise ValueError(
            "endpoints=finetuned fine-tunes classifiers from a parent on several tasks: set pretrain.enabled=true, "
            "endpoints.tasks (e.g. [{subset:0},{subset:1}]) and a classification dataset "
            f"(data.task is {cfg.data.task})"
        )
    own = copy.deepcopy(cfg)
    try:
        own.data.merge_with(cfg.endpoints.tasks[task] or {})
    except Exception as err:  # a misspelled key or a wrong type: name the task
        raise ValueError(f"endpoints.tasks[{task}]: {err}") from None
    with open_dict(own):
        own.endpoints.tasks = []
    return own


@dataclass
class Task:
    children: dict[int, Endpoint]  # seed -> child
    test: list  # (inputs, labels) batches of the test split
    train: list  # the first merge.batches training batches: the merges' statistics


def grow(own: Config, key: dict[str, Any], start, run_dir: Path, tracker, evaluator) -> dict[int, Endpoint]:
    """seed -> child for every seed of `seeds`, cached under `key`: from the cache, or trained now from
    `start()` (called only to train). With train.ensemble, spawned children not cached yet train together
    first (glmc.pipeline.ensemble), each as it would alone, and are then loaded from the cache."""
    cache, children = EndpointCache(Path(own.cache_dir)), {}
    fresh: set[int] = set()
    if str(own.endpoints.source) == "spawn":
        todo = lambda cfg: [(i, s, key) for i, s in enumerate(cfg.seeds) if not cache.has(key, s)]  # noqa: E731
        fresh = train_ensemble(own, run_dir, tracker, evaluator, todo, endpoint_seeds, divergence_hint(own), start)
    for seed in own.seeds:
        with cache.lock(key, seed) as waited:
            model, metrics, cached = load_or_train(own, seed, key, cache, run_dir, tracker, evaluator, waited, start)
        loss, accuracy = metrics["test_loss"], metrics["test_accuracy"]
        cached = cached and seed not in fresh  # trained together by this run: not a cache hit
        children[seed] = Endpoint(seed, model.eval(), to_canonical(model), loss, accuracy, cached)
    return children


def get_children(cfg: Config, run_dir: Path, tracker) -> list[Task]:
    """Every task's children, from the cache or fine-tuned now from the parent (trained or loaded once,
    when the first child needs it)."""
    parent = functools.cache(functools.partial(pretrained_model, cfg, run_dir, tracker))
    tasks = []
    for index in range(len(cfg.endpoints.tasks) or 1):  # none: task_config says what is missing
        own = task_config(cfg, index)
        data = DataModule(own.data, seed=0)
        data.setup()
        train = list(itertools.islice(data.train_dataloader(), cfg.merge.batches))
        task = Task({}, list(data.test_dataloader()), train)
        evaluator = Evaluator(task.test, task=own.data.task, progress=cfg.trainer.enable_progress_bar)
        task.children = grow(own, cache_key(own), parent, run_dir / f"task_{index}", tracker, evaluator)
        tasks.append(task)
    return tasks


def training_budget(cfg: Config) -> int:
    """The optimizer steps of an endpoint's training, as Lightning counts them on one device: batches per
    epoch (after trainer.limit_train_batches), over train.accumulate_grad_batches, times train.max_epochs."""
    data = DataModule(cfg.data)
    data.setup()
    n, size = len(data.train_set), cfg.data.batch_size
    batches = n // size if n > size else 1  # the loader drops a last partial batch where there are several
    limit = cfg.trainer.limit_train_batches
    if limit is not None:
        batches = int(batches * limit) if limit <= 1 else min(batches, int(limit))  # a share, or a count
    return math.ceil(batches / cfg.train.accumulate_grad_batches) * cfg.train.max_epochs


def spawn_problems(cfg: Config, budget: int) -> list[str]:
    """What endpoints=spawn cannot do with these settings (the budget: the parent's optimizer steps)."""
    steps = list(cfg.endpoints.steps)
    problems = [
        f"endpoints.steps={steps}: step {k} is beyond the parent's budget of {budget} optimizer steps "
        f"(train.max_epochs={cfg.train.max_epochs} epochs of the training batches); use steps <= {budget}"
        for k in [k for k in steps if k > budget][:1]
    ]
    if cfg.train.early_stopping_patience is not None:
        problems.append(
            "endpoints=spawn trains every child to the parent's budget: set train.early_stopping_patience=null"
        )
    if cfg.pretrain.enabled or str(cfg.pairing) == "universe":
        problems.append(
            "endpoints=spawn pairs children of one trained parent: set pretrain.enabled=false and a pairing "
            "of pairs (disjoint, all or first)"
        )
    return problems


def spawn_points(cfg: Config, key: dict[str, Any], run_dir: Path, tracker) -> dict[int, SpawnPoint]:
    """step -> the parent's training state there, for every step of endpoints.steps: from the cache, those
    missing captured along one training of the parent (seed_fixed) now."""
    cache, seed, steps = EndpointCache(Path(cfg.cache_dir)), cfg.seed_fixed, list(cfg.endpoints.steps)
    at = lambda k: {**key, "spawn_point": k}  # noqa: E731
    parent = {**key, "spawn_parent": seed}
    with cache.lock(parent, seed):
        missing = [k for k in steps if not cache.has(at(k), seed)]
        if missing:
            log.info("spawn parent (seed %d): training for its states at steps %s", seed, missing)
            save = lambda k, point: cache.save(at(k), seed, point, {"step": k, "total": point.total})  # noqa: E731
            logger = tracker.lightning_logger("spawn_parent", "train")
            training = cache.training_dir(parent, seed)
            resume = resumable(training / "last.ckpt")
            if resume is not None and min(missing) < torch.load(resume, weights_only=True)["global_step"]:
                shutil.rmtree(training)  # a state before the interrupted run's checkpoint: train from the start
            train_endpoint(cfg, seed, run_dir, logger, training, callbacks=(SpawnPoints(missing, save),))
            shutil.rmtree(training, ignore_errors=True)
        points = {}
        for k in steps:
            if not cache.has(at(k), seed):
                raise ValueError(f"endpoints.steps: the parent's training ended before step {k}; use smaller steps")
            points[k] = SpawnPoint(build_model(cfg.model), k, 0)
            points[k].total = cache.load(at(k), seed, points[k])["metrics"]["total"]
    return points


def _named(seeds: list[int]) -> str:
    return f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {', '.join(map(str, seeds))}"


def spawn_kept(cfg: Config) -> str:
    """What an interrupted spawn run's endpoint stage kept, for its message (endpoints.training_kept says it
    for the other modes): the parent's states, or its last finished epoch's checkpoint; then each step's
    children, cached, checkpointed (an epoch finished) or with no finished epoch, each with its own folder."""
    cache, key, parent, steps = EndpointCache(Path(cfg.cache_dir)), cache_key(cfg), cfg.seed_fixed, cfg.endpoints.steps
    states = [k for k in steps if cache.entry({**key, "spawn_point": k}, parent).is_dir()]
    last = cache.training_dir({**key, "spawn_parent": parent}, parent) / "last.ckpt"
    if len(states) == len(steps):
        kept = [f"the parent's (seed {parent}) states at steps {list(steps)} cached in {cfg.cache_dir}"]
    elif last.exists():
        kept = [f"the last finished epoch of the parent (seed {parent}) checkpointed in {last}"]
    else:  # its children start once its training has ended
        return f"the parent (seed {parent}) with no finished epoch yet (checkpoints go to {last}); no child begun"
    for k in steps:
        child = {**key, "spawned_from": {"seed": parent, "step": k}}
        folder = cache.entry(child, 0).parent
        cached = [s for s in cfg.seeds if cache.entry(child, s).is_dir()]  # renamed into place when complete
        checkpoints = {s: _child_checkpoint(cache.training_dir(child, s), s) for s in cfg.seeds if s not in cached}
        checkpoints = {s: path for s, path in checkpoints.items() if path.exists()}
        nothing = [s for s in cfg.seeds if s not in cached and s not in checkpoints]
        kept += [f"step {k}'s children of {_named(cached)} cached in {folder}"] if cached else []
        own = "the last finished epoch of step {}'s child of seed {} checkpointed in {}"
        kept += [own.format(k, s, path) for s, path in checkpoints.items()]
        if nothing and len(states) == len(steps):
            kept.append(
                f"step {k}'s children of {_named(nothing)} with no finished epoch yet "
                f"(checkpoints go to {folder}/.train_seed_<n>/last.ckpt)"
            )
    return "; ".join(kept)


def _child_checkpoint(training_dir: Path, seed: int) -> Path:
    """A child's last.ckpt: its own, or that of the ensemble it trains in (train.ensemble), where one exists."""
    own = training_dir / "last.ckpt"
    return own if own.exists() else ensemble_checkpoint(training_dir, seed) or own


def get_spawned(cfg: Config, run_dir: Path, tracker, evaluator) -> dict[int, dict[int, Endpoint]]:
    """step k -> seed -> the child continued from the parent's state at k, from the cache or trained now."""
    key = cache_key(cfg)
    problems = spawn_problems(cfg, training_budget(cfg))
    if problems:
        raise ValueError("; ".join(problems))
    points = functools.cache(functools.partial(spawn_points, cfg, key, run_dir, tracker))
    groups = {}
    for k in cfg.endpoints.steps:
        start = lambda k=k: copy.deepcopy(points()[k])  # noqa: E731  (each child trains its own copy)
        child = {**key, "spawned_from": {"seed": cfg.seed_fixed, "step": k}}
        groups[k] = grow(cfg, child, start, run_dir / f"spawn_{k}", tracker, evaluator)
    return groups


def pair_lists(tasks: int, seeds: list[int]) -> dict[str, list[tuple[tuple[int, int], tuple[int, int]]]]:
    """kind -> pairs of (task, seed) children, A first: same task (seeds differ), cross-task (same seed)."""
    same = [((k, s), (k, t)) for k in range(tasks) for s, t in itertools.combinations(seeds, 2)]
    cross = [((i, s), (j, s)) for i, j in itertools.combinations(range(tasks), 2) for s in seeds]
    return {"same": same, "cross": cross}


def with_head(encoder: CanonicalTransformer, head_from: CanonicalTransformer) -> CanonicalTransformer:
    """The merged encoder with the classifier of `head_from` (every head.* tensor)."""
    params = encoder.params()
    params.update({k: v for k, v in head_from.params().items() if k.startswith("head.")})
    return CanonicalTransformer(encoder.config, params)


def moved_share(alignment) -> float | None:
    """The share of the permuted spaces' units that moved (children of one parent may already be aligned)."""
    perms = [g.perm for g in (alignment.transform or {}).values() if isinstance(g, (Permutation, SignedPermutation))]
    total = sum(len(p) for p in perms)
    return sum(int((p != torch.arange(len(p))).sum()) for p in perms) / total if total else None


def pair_records(cfg: Config, tasks: list[Task], pair, kind: str, matchers: dict[str, Any], stats) -> list[dict]:
    """The two children's own scores (method "endpoints"), then one record per (method, variant, merge).
    `stats`: each child's merge statistics on its own task's training batches."""
    (ka, sa), (kb, sb) = pair
    a, b = tasks[ka].children[sa], tasks[kb].children[sb]
    base = {"kind": kind, "pair": f"d{ka}s{sa}-d{kb}s{sb}"}
    (fa, acc_a), (fb, acc_b) = classify(a.canonical, tasks[ka].test), classify(b.canonical, tasks[kb].test)
    records = [{**base, "method": "endpoints", "f1": (fa + fb) / 2, "accuracy": (acc_a + acc_b) / 2}]
    kinds, inputs = ["average", *cfg.merge.kinds], tasks[kb].test[0][0]
    for name, matcher in matchers.items():
        alignment = matcher.match(a.canonical, b.canonical, None)
        for variant, aligned in {"main": alignment, **alignment.variants}.items():
            ref, model = canonical_pair(aligned, a.canonical, b.canonical)
            main = variant == "main"
            entry = {
                **base,
                "method": name,
                "variant": variant,
                "match_seconds": (alignment.diagnostics or {}).get("seconds", 0.0) if main else None,
                "distance": factored_distance(ref.params(), model.params()),
                "deviation": relative_deviation(model(inputs), b.canonical(inputs)),  # function preserved?
                "moved": moved_share(aligned) if main else None,
            }
            # unaligned B (vanilla) has its statistics already; an aligned B's are its own
            b_stats = stats[(kb, sb)] if model is b.canonical else own_statistics(kinds, model, tasks[kb].train)
            merged = own_data_merges(kinds, ref, model, (stats[(ka, sa)], b_stats), cfg.merge.regmean_alpha)
            for merge, (m, seconds) in merged.items():
                fa, acc_a = classify(with_head(m, ref), tasks[ka].test)
                fb, acc_b = classify(with_head(m, model), tasks[kb].test)
                scores = {"f1": (fa + fb) / 2, "accuracy": (acc_a + acc_b) / 2, "merge_seconds": seconds}
                records.append({**entry, "merge": merge, **scores})
    return records


def run_children(cfg: Config, run_dir: Path, stage: dict[str, str]) -> dict[str, Any]:
    """The children (the endpoint stage), then every pair aligned, merged and scored; results.json holds
    the children's own scores and one record per (pair, method, variant, merge) under `children`."""
    matchers = {name: build_matcher(method_config(cfg, name)) for name in cfg.matcher.methods}
    with Tracker(cfg, run_dir) as tracker:
        stage["name"] = "endpoints"
        tasks = get_children(cfg, run_dir, tracker)
    stage.clear()
    kinds, pairs = ["average", *cfg.merge.kinds], pair_lists(len(tasks), list(cfg.seeds))
    children = [(k, s, e, t) for k, t in enumerate(tasks) for s, e in t.children.items()]
    stats = {(k, s): own_statistics(kinds, e.canonical, t.train) for k, s, e, t in children}
    records = [r for kind, ps in pairs.items() for p in ps for r in pair_records(cfg, tasks, p, kind, matchers, stats)]
    keys = ("test_loss", "test_accuracy", "cached")
    endpoints = [{"task": k, "seed": s, **{key: getattr(e, key) for key in keys}} for k, s, e, _ in children]
    results = {"experiment": cfg.experiment, "model": cfg.model.name, "dataset": cfg.data.name, "task": cfg.data.task}
    results.update(endpoints=endpoints, methods={}, children=records, config=OmegaConf.to_container(cfg, resolve=True))
    write_results(results, run_dir)
    print(f"{sum(map(len, pairs.values()))} pairs, {len(records)} records\nwrote {run_dir / 'results.json'}")
    return results


def run_spawn(cfg: Config, run_dir: Path, stage: dict[str, str], test, evaluator, tracker, measure) -> dict[str, Any]:
    """The children of every spawn step (the endpoint stage), then each step's pairs measured by
    `measure(children, their own losses on the path's batches or None, folder)`: every method of
    matcher.methods, as the pipeline measures its endpoints. results.json's `spawn` holds per step k, per
    method, the mean barrier, its standard error and each pair's, and each child's test loss; spawn.png
    draws them; with W&B, the mean barrier per method against k is logged as a line plot."""
    stage["name"] = "endpoints"
    groups = get_spawned(cfg, run_dir, tracker, test)
    stage.clear()
    steps, summary = list(groups), {"barrier": {}, "barrier_se": {}, "pair_barriers": {}}
    for k, children in groups.items():
        ends = list(children.values())
        own = None  # where every function-preserving path must end (under autocast: not checked)
        if cfg.eval.precision == EvalPrecision.full:
            own = [e.test_loss if evaluator is test else evaluator.evaluate(e.model)[0] for e in ends]
        methods = measure(ends, own, Path(f"spawn/step_{k}"))
        for field, value in (("barrier", "barrier"), ("barrier_se", "barrier_se")):
            summary[field][str(k)] = {m: s[value] for m, s in methods.items()}
        summary["pair_barriers"][str(k)] = {m: [p["barrier"] for p in s["pairs"]] for m, s in methods.items()}
        log.info("spawn step %d: %s", k, ", ".join(f"{m} barrier {s['barrier']:.4f}" for m, s in methods.items()))
    losses = {str(s): [groups[k][s].test_loss for k in steps] for s in cfg.seeds}
    endpoints = [
        {
            "step": k,
            "seed": s,
            "init_seed": cfg.seed_fixed,
            "data_seed": s,
            "test_loss": e.test_loss,
            "test_accuracy": e.test_accuracy,
            "cached": e.cached,
        }
        for k, children in groups.items()
        for s, e in children.items()
    ]
    # what ran: the children share the parent's weights and differ by their data order (whatever seed_vary says)
    spawn = {"steps": steps, "parent_seed": cfg.seed_fixed, "budget": training_budget(cfg), "seed_vary": "data"}
    spawn.update(summary)
    results = {"experiment": cfg.experiment, "model": cfg.model.name, "dataset": cfg.data.name, "task": cfg.data.task}
    results.update(endpoints=endpoints, methods={}, spawn={**spawn, "endpoint_loss": losses})
    results["config"] = OmegaConf.to_container(cfg, resolve=True)
    if int(os.environ.get("RANK", 0)) == 0:  # one process writes (torchrun, SLURM)
        write_results(results, run_dir)
        rows = {m: [list(r) for r in zip(*(summary["pair_barriers"][str(k)][m] for k in steps))] for m in methods}
        title = f"{cfg.model.name} on {cfg.data.name}: children spawned at step k of {spawn['budget']}"
        plot_barrier_against(
            run_dir / "spawn.png",
            steps,
            rows,
            {"child test loss": list(losses.values())},
            xlabel="spawn step k (optimizer steps)",
            title=title,
            log_x=True,
        )
        tracker.log_results(results)
        lines = {m: [summary["barrier"][str(k)][m] for k in steps] for m in methods}
        tracker.log_lines("spawn/barrier", steps, lines, "spawn step k")
        print(format_spawn(results) + f"\nwrote {run_dir / 'results.json'}, spawn.png")
    return results


def format_spawn(results: dict[str, Any]) -> str:
    """One row per spawn step: every method's mean barrier (± s.e. over pairs) and the children's mean loss."""
    spawn = results["spawn"]
    steps = spawn["steps"]
    methods = list(spawn["barrier"][str(steps[0])])
    header = f"{'k':>8}" + "".join(f"{m:>18}" for m in methods) + f"{'child loss':>12}"
    lines = [
        f"children spawned from the parent (seed {spawn['parent_seed']}) at step k of {spawn['budget']}",
        header,
        "-" * len(header),
    ]
    for i, k in enumerate(steps):
        cells = ""
        for m in methods:
            se = spawn["barrier_se"][str(k)][m]
            cells += f"{spawn['barrier'][str(k)][m]:.4f}{'' if se is None else f' ± {se:.3f}':<8}".rjust(18)
        loss = np.mean([losses[i] for losses in spawn["endpoint_loss"].values()])
        lines.append(f"{k:>8}{cells}{loss:>12.4f}")
    return "\n".join(lines)
