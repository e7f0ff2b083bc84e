"""endpoints=finetuned: children fine-tuned from one parent (`pretrain`: trained once or read from the
endpoint cache), one per seed on each task of `endpoints.tasks` (overrides of `data`), each cached with the
parent's key in its own; another source of children differs only in its parent and per-child config.

Pairs: same task (seeds differ) and cross-task (tasks differ, same seed). Each method of matcher.methods
aligns B to A; the aligned B and each variant merge with A at the midpoint (the average and merge.kinds, each
model's statistics on its own task's training batches), scored with each task's classifier copied: the
merged encoder with A's on A's test set, with aligned B's on B's (the mean of the two)."""

from __future__ import annotations

import copy
import functools
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf, open_dict

from glmc.config import Config
from glmc.data.module import DataModule
from glmc.eval.evaluator import Evaluator
from glmc.matching.registry import build_matcher, method_config
from glmc.matching.rotation import factored_distance
from glmc.models.canonical import CanonicalTransformer, relative_deviation
from glmc.models.convert import to_canonical
from glmc.pipeline.cache import EndpointCache
from glmc.pipeline.endpoint_record import Endpoint
from glmc.pipeline.endpoints import cache_key, load_or_train, pretrained_model
from glmc.pipeline.merges import canonical_pair, own_data_merges, own_statistics
from glmc.pipeline.outputs import write_results
from glmc.pipeline.tracking import Tracker
from glmc.symmetry import Permutation


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


def get_children(cfg: Config, run_dir: Path, tracker) -> list[Task]:
    """Every task's children, from the cache or fine-tuned now from the parent (trained or loaded once,
    when the first child needs it)."""
    parent = functools.cache(functools.partial(pretrained_model, cfg, run_dir, tracker))
    cache, tasks = EndpointCache(Path(cfg.cache_dir)), []
    for index in range(len(cfg.endpoints.tasks) or 1):  # none: task_config says what is missing
        own = task_config(cfg, index)
        data = DataModule(own.data, seed=0)
        data.setup()
        train = list(itertools.islice(data.train_dataloader(), cfg.merge.batches))
        task = Task({}, list(data.test_dataloader()), train)
        evaluator = Evaluator(task.test, task=own.data.task, progress=cfg.trainer.enable_progress_bar)
        key = cache_key(own)
        for seed in cfg.seeds:
            with cache.lock(key, seed) as waited:
                args = (own, seed, key, cache, run_dir / f"task_{index}", tracker, evaluator, waited, parent)
                model, metrics, cached = load_or_train(*args)
            loss, accuracy = metrics["test_loss"], metrics["test_accuracy"]
            task.children[seed] = Endpoint(seed, model.eval(), to_canonical(model), loss, accuracy, cached)
        tasks.append(task)
    return tasks


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
    perms = [g.perm for g in (alignment.transform or {}).values() if isinstance(g, Permutation)]
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
