"""Paper 002's Table 1 at CPU size: tiny RoBERTas fine-tuned from one pretrained (masked-LM) checkpoint
on three topic-disjoint datasets of one 4-label task (data=pydoc_topics), merged pairwise.

Steps: `run.py experiment=roberta_finetune data.subset=K` for K = 0, 1, 2 trains (or loads) each
dataset's endpoints, seeds 0, 1, 2, all fine-tuned from the same cached pretrained model. `make` reads
those endpoints back from the endpoint cache and, for every pair,

  - aligns B to A with the rotation matcher in two scopes: attention only (paper 002: residual stream,
    heads and MLP left in place) and the whole model (ours: residual stream, heads and MLP permuted
    first), each giving three rows from one call: in-head permutations, rotations, rotations + rescaling;
  - merges A and aligned B (and unaligned B: vanilla) three ways: the simple midpoint average, Fisher
    averaging and RegMean, each model's Fisher / Gram statistics from its own training data;
  - copies the classifier from each task's model (paper 002): the merged encoder with A's head tensors
    is scored on A's test set, with aligned B's on B's, and the cell is the mean of the two macro-F1s.

Pairs: same dataset (seeds differ: 3 datasets x 3 pairs) and cross-dataset (datasets differ, same seed:
3 dataset pairs x 3 seeds). Paper 002's "in-domain" column merges models of different emotion datasets:
our cross-dataset pairs are its counterpart; the same-dataset pairs add what seeds alone do.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf

from glmc.report.artefact import TINY_TEXT_MODEL, Artefact, Step
from glmc.report.results import mean_se, run_results
from glmc.report.section import write_section
from glmc.report.tables import markdown, mean_pm, seconds, write_csv
from glmc.safe_files import atomic_write_text

DATASETS = (0, 1, 2)
# --tiny: a one-layer, width-32 RoBERTa, one epoch of pretraining and of fine-tuning on a few windows, two seeds
TINY = (
    "model=roberta_tiny",  # the experiment's own model, named for the reader (debug=fast keeps it)
    *TINY_TEXT_MODEL,
    "data.limit_train=64",
    "data.limit_test=32",
    "pretrain.data.seq_len=32",
    "pretrain.data.limit_train=64",
    "pretrain.data.limit_test=16",
    "train.max_epochs=1",
    "pretrain.train.max_epochs=1",
    "eval.num_lambdas=3",
    "seeds=[0,1]",  # one seed pair per dataset: 3 same-dataset and 3 cross-dataset pairs
)
STEPS = tuple(
    Step(label=f"roberta_finetune_{k}", overrides=("experiment=roberta_finetune", f"data.subset={k}"), tiny=TINY)
    for k in DATASETS
)
ROOT = Path(__file__).resolve().parents[3]  # the repository: conf/, and where run.py resolves relative paths
RECORD = "reproduce.json"  # experiments/reproduce.py's record of a finished step (its overrides)
# the run settings the endpoints and merges depend on: taken from the run itself, so that what --set gave
# it (cache_dir, trainer) is honoured
RUN_KEYS = ("seeds", "cache_dir", "model", "data", "train", "pretrain", "trainer", "endpoint_models", "merge")

SCOPES = {  # RotationMatcher settings besides rescale=True
    "attention": ("attention only (paper 002)", {"residual": "none", "heads": "none", "mlp": "none"}),
    "whole": ("whole model (ours)", {"residual": "permutation", "heads": "permutation", "mlp": "permutation"}),
}
MATCHINGS = {  # row -> (label, the rotation matcher's variant; None: its main result)
    "permutation": ("in-head permutation", "head_permutation"),
    "rotation": ("rotation", "no_rescale"),
    "rescaled": ("rotation + rescaling", None),
}
MERGES = {"simple": "simple", "fisher": "Fisher", "regmean": "RegMean"}
KINDS = {"same": "same dataset", "cross": "cross-dataset"}


# -- scores --------------------------------------------------------------------------------------
def macro_f1(predicted: Sequence[int] | np.ndarray, labels: Sequence[int] | np.ndarray) -> float:
    """Per-class F1 = 2 TP / (2 TP + FP + FN), averaged over the classes that occur in the labels or
    the predictions; a class in neither has no defined F1 and is skipped."""
    predicted, labels = np.asarray(predicted).ravel(), np.asarray(labels).ravel()
    if predicted.shape != labels.shape or not len(labels):
        raise ValueError(f"macro_f1: {predicted.size} predictions for {labels.size} labels")
    scores = []
    for c in np.union1d(predicted, labels):
        tp = np.sum((predicted == c) & (labels == c))
        wrong = np.sum((predicted == c) != (labels == c))  # false positives + false negatives
        scores.append(2 * tp / (2 * tp + wrong))
    return float(np.mean(scores))


@torch.no_grad()
def classify(model: torch.nn.Module, loader: Iterable) -> tuple[float, float]:
    """(macro-F1, accuracy) of the model's arg-max class on (inputs, labels) batches."""
    predicted, labels = [], []
    for inputs, targets in loader:
        predicted.append(model(inputs).argmax(-1))
        labels.append(targets)
    p, y = torch.cat(predicted).numpy(), torch.cat(labels).numpy()
    return macro_f1(p, y), float(np.mean(p == y))


# -- inputs --------------------------------------------------------------------------------------
def run_config(root: Path, step: Step):
    """The run config of `step` and its results.json: composed from the step's overrides (those
    reproduce.py recorded, --tiny's included), with the run's own resolved settings laid over what its
    endpoints depend on."""
    from hydra import compose, initialize_config_dir

    from glmc.config import register_configs

    folder = Path(root) / step.label
    results = run_results(folder)
    saved = results["config"]
    record = folder / RECORD
    overrides = json.loads(record.read_text())["overrides"] if record.is_file() else list(step.overrides)
    if not (ROOT / "conf").is_dir():
        raise FileNotFoundError(f"{ROOT / 'conf'} is missing: install glmc editable (pip install -e .)")
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides))
    cfg = OmegaConf.merge(cfg, {key: saved[key] for key in RUN_KEYS})
    if not Path(cfg.cache_dir).is_absolute():  # relative to where run.py ran, not to this process
        cfg.cache_dir = str(ROOT / cfg.cache_dir)
    return cfg, results


@dataclass
class TopicData:
    """One topic dataset as the merges and scores read it."""

    test: list  # (inputs, labels) batches of the test split
    train: list  # the training batches merges take statistics on (the run's merge.batches)


def load_dataset(cfg) -> TopicData:
    from glmc.data.module import DataModule

    data = DataModule(cfg.data, seed=0)  # the order the run's own merges read (glmc.pipeline.run)
    data.setup()
    train = itertools.islice(data.train_dataloader(), cfg.merge.batches)
    return TopicData(list(data.test_dataloader()), list(train))


@dataclass
class Statistics:
    """One model's Fisher diagonal and RegMean Gram matrices on its own training batches."""

    fisher: dict[str, torch.Tensor]
    grams: dict[str, torch.Tensor]
    fisher_seconds: float
    regmean_seconds: float


def statistics(model, batches: list) -> Statistics:
    from glmc.merging import fisher_information, gram_matrices

    start = time.perf_counter()
    fisher = fisher_information([model], batches)[0]
    middle = time.perf_counter()
    grams = gram_matrices([model], batches)[0]
    return Statistics(fisher, grams, middle - start, time.perf_counter() - middle)


# -- merging -------------------------------------------------------------------------------------
def merges(a, b, sa: Statistics, sb: Statistics, alpha: float) -> dict[str, tuple[Any, float]]:
    """merge -> (merged model, seconds including both models' statistics) of A and (aligned) B."""
    from glmc.interpolation import merge_params
    from glmc.merging import fisher_average, regmean_from_grams
    from glmc.models.canonical import CanonicalTransformer

    pa, pb = a.params(), b.params()
    build = {
        "simple": lambda: CanonicalTransformer(a.config, merge_params([pa, pb], [0.5, 0.5])),
        "fisher": lambda: CanonicalTransformer(a.config, fisher_average([pa, pb], [sa.fisher, sb.fisher])),
        "regmean": lambda: regmean_from_grams([a, b], [sa.grams, sb.grams], alpha=alpha),
    }
    statistics_seconds = {
        "simple": 0.0,  # needs no data
        "fisher": sa.fisher_seconds + sb.fisher_seconds,
        "regmean": sa.regmean_seconds + sb.regmean_seconds,
    }
    out = {}
    for kind, merge in build.items():
        start = time.perf_counter()
        with torch.no_grad():
            merged = merge()
        out[kind] = (merged, time.perf_counter() - start + statistics_seconds[kind])
    return out


def with_head(encoder, head_from):
    """The merged encoder with the classifier of `head_from` (every head.* tensor)."""
    from glmc.models.canonical import CanonicalTransformer

    params = encoder.params()
    params.update({k: v for k, v in head_from.params().items() if k.startswith("head.")})
    return CanonicalTransformer(encoder.config, params)


def copied_head_scores(merged, a, b, test_a: list, test_b: list) -> tuple[float, float]:
    """Mean (macro-F1, accuracy) of the merged encoder with A's classifier on A's test set and with
    (aligned) B's on B's."""
    fa, acc_a = classify(with_head(merged, a), test_a)
    fb, acc_b = classify(with_head(merged, b), test_b)
    return (fa + fb) / 2, (acc_a + acc_b) / 2


# -- the pairs -----------------------------------------------------------------------------------
def pair_lists(seeds: Sequence[int]) -> dict[str, list[tuple[tuple[int, int], tuple[int, int]]]]:
    """kind -> pairs of (dataset, seed) endpoints, A first."""
    same = [((k, s), (k, t)) for k in DATASETS for s, t in itertools.combinations(seeds, 2)]
    cross = [((i, s), (j, s)) for i, j in itertools.combinations(DATASETS, 2) for s in seeds]
    return {"same": same, "cross": cross}


def permuted_share(transform) -> float:
    """The share of the units in the permuted spaces (residual, heads, MLP) that moved: fine-tuned from
    one checkpoint, the models may already be aligned."""
    from glmc.symmetry import Permutation

    perms = [g.perm for g in transform.values() if isinstance(g, Permutation)]
    total = sum(len(p) for p in perms)
    return sum(int((p != torch.arange(len(p))).sum()) for p in perms) / total if total else 0.0


def measure(root: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One record per (pair, row, merge) and the endpoints' own scores; plus checks for the text."""
    from glmc.matching.rotation import RotationMatcher, factored_distance
    from glmc.models import to_canonical
    from glmc.models.canonical import relative_deviation
    from glmc.pipeline.endpoints import cached_endpoints

    models, data, seeds, alpha, run_accuracy = {}, {}, None, None, {}
    for k, step in zip(DATASETS, STEPS):
        cfg, results = run_config(root, step)
        hint = f"step {step.label} of `python experiments/reproduce.py roberta_finetune` (into {root})"
        for seed, model in zip(cfg.seeds, cached_endpoints(cfg, hint)):
            models[(k, seed)] = to_canonical(model)
        data[k] = load_dataset(cfg)
        run_accuracy.update({(k, e["seed"]): e["test_accuracy"] for e in results["endpoints"]})
        if seeds is not None and list(cfg.seeds) != seeds:
            raise ValueError(f"{step.label} has seeds {list(cfg.seeds)}, the others {seeds}: pairs need the same seeds")
        seeds, alpha = list(cfg.seeds), float(cfg.merge.regmean_alpha)

    own = {key: classify(m, data[key[0]].test) for key, m in models.items()}
    stats = {key: statistics(m, data[key[0]].train) for key, m in models.items()}
    records: list[dict[str, Any]] = []
    deviation, moved = 0.0, []
    for kind, pairs in pair_lists(seeds).items():
        for (ka, sa), (kb, sb) in pairs:
            a, b = models[(ka, sa)], models[(kb, sb)]
            base = {"kind": kind, "pair": f"d{ka}s{sa}-d{kb}s{sb}"}
            f1 = (own[(ka, sa)][0] + own[(kb, sb)][0]) / 2
            accuracy = (own[(ka, sa)][1] + own[(kb, sb)][1]) / 2
            for merge in MERGES:  # un-merged: the same reference in every merge column
                records.append({**base, "scope": "endpoints", "matching": "endpoints", "merge": merge})
                records[-1].update(f1=f1, accuracy=accuracy, match_seconds=None, merge_seconds=None, distance=None)
            rows = [("none", "vanilla", b, stats[(kb, sb)], 0.0)]
            for scope, (_, settings) in SCOPES.items():
                alignment = RotationMatcher(name=f"rotation_{scope}", rescale=True, **settings).match(a, b)
                if scope == "whole":
                    moved.append(permuted_share(alignment.transform))
                for matching, (_, variant) in MATCHINGS.items():
                    aligned = alignment.model if variant is None else alignment.variants[variant].model
                    inputs = data[kb].test[0][0]
                    deviation = max(deviation, relative_deviation(aligned(inputs), b(inputs)))
                    spent = alignment.diagnostics["seconds"] if variant is None else None
                    rows.append((scope, matching, aligned, statistics(aligned, data[kb].train), spent))
            for scope, matching, aligned, sb_stats, spent in rows:
                distance = factored_distance(a.params(), aligned.params())
                for merge, (merged, merge_seconds) in merges(a, aligned, stats[(ka, sa)], sb_stats, alpha).items():
                    f1, accuracy = copied_head_scores(merged, a, aligned, data[ka].test, data[kb].test)
                    records.append(
                        {
                            **base,
                            "scope": scope,
                            "matching": matching,
                            "merge": merge,
                            "f1": f1,
                            "accuracy": accuracy,
                            "match_seconds": spent,
                            "merge_seconds": merge_seconds,
                            "distance": distance,
                        }
                    )
    agreement = max(abs(own[key][1] - run_accuracy[key]) for key in own)
    checks = {"deviation": deviation, "accuracy_vs_runs": agreement, "seeds": seeds, "moved": float(np.mean(moved))}
    return records, checks


# -- the table -----------------------------------------------------------------------------------
ROWS = [("endpoints", "endpoints"), ("none", "vanilla")] + [(s, m) for s in SCOPES for m in MATCHINGS]


def row_label(scope: str, matching: str) -> tuple[str, str]:
    if scope == "endpoints":
        return "—", "endpoints, not merged"
    if scope == "none":
        return "—", "vanilla (no alignment)"
    return SCOPES[scope][0], MATCHINGS[matching][0]


def _mean_of(records: list[dict[str, Any]], name: str) -> float | None:
    values = [r[name] for r in records if r[name] is not None]
    return float(np.mean(values)) if values else None


def summarise(records: list[dict[str, Any]]) -> dict[tuple[str, str, str, str], dict[str, Any]]:
    """(kind, scope, matching, merge) -> pairs, F1 and accuracy (%) mean and s.e., mean seconds, and
    the per-pair F1s in pair order (for paired differences)."""
    groups: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["kind"], r["scope"], r["matching"], r["merge"]), []).append(r)
    out = {}
    for key, rs in groups.items():
        f1, f1_se = mean_se([100 * r["f1"] for r in rs])
        acc, acc_se = mean_se([100 * r["accuracy"] for r in rs])
        out[key] = {
            "pairs": len(rs),
            "f1": f1,
            "f1_se": f1_se,
            "accuracy": acc,
            "accuracy_se": acc_se,
            "match_seconds": _mean_of(rs, "match_seconds"),
            "merge_seconds": _mean_of(rs, "merge_seconds"),
            "distance": _mean_of(rs, "distance"),
            "per_pair": [100 * r["f1"] for r in rs],
        }
    return out


def _difference(stats, kind: str, better: tuple[str, str], worse: tuple[str, str], merge: str) -> tuple[float, Any]:
    """Mean ± s.e. over pairs of the paired F1 difference (percentage points)."""
    x = np.array(stats[(kind, *better, merge)]["per_pair"]) - np.array(stats[(kind, *worse, merge)]["per_pair"])
    return mean_se(list(x))


def _verdict(delta: float, se: float | None, up: str, down: str, same: str) -> tuple[str, str]:
    word = same if abs(delta) < 1e-9 else up if delta > 0 else down
    within = se is not None and 1e-9 <= abs(delta) <= se
    return word, " (within one s.e.)" if within else ""


def findings(stats) -> list[str]:
    """(a) does matching (rotation + rescaling) improve simple merging over vanilla; (b) is rotation +
    rescaling at least as good as in-head permutation; per scope and pair kind, from the numbers."""
    lines = []
    for scope, (scope_label, _) in SCOPES.items():
        for kind, kind_label in KINDS.items():
            d, se = _difference(stats, kind, (scope, "rescaled"), ("none", "vanilla"), "simple")
            a, within = _verdict(d, se, "improves", "lowers", "does not change")
            parts = []
            at_least = 0
            for merge, merge_label in MERGES.items():
                db, sb = _difference(stats, kind, (scope, "rescaled"), (scope, "permutation"), merge)
                at_least += db >= -1e-9
                parts.append(f"{merge_label} {mean_pm(db, sb, 2)}")
            b = "yes" if at_least == len(MERGES) else "no" if at_least == 0 else "partly"
            lines.append(
                f"- {scope_label}, {kind_label} pairs: (a) matching {a} simple merging{within}: rotation + "
                f"rescaling − vanilla = {mean_pm(d, se, 2)} points; (b) rotation + rescaling at "
                f"least as good as in-head permutation: {b}, in {at_least} of {len(MERGES)} merges "
                f"(differences {', '.join(parts)} points)."
            )
    return lines


def distances(records: list[dict[str, Any]], moved: float) -> str:
    """How far aligned B lies from A per row (the matcher's relative distance), and how much of the
    whole-model permutations moved: why matching changes merges little or much."""

    def mean(scope: str, matching: str) -> float:
        rs = [r for r in records if (r["scope"], r["matching"], r["merge"]) == (scope, matching, "simple")]
        return _mean_of(rs, "distance")

    vanilla = mean("none", "vanilla")
    parts = [f"vanilla {vanilla:.4f}"]
    for scope, matching in ROWS[2:]:
        d = mean(scope, matching)
        parts.append(f"{', '.join(row_label(scope, matching))} {d:.4f} ({100 * (d / vanilla - 1):+.1f} %)")
    return (
        "Relative distance of B to A, ‖θ_A − θ_B‖ / ‖θ_A‖ over every tensor, mean over all pairs: "
        + "; ".join(parts)
        + f". Whole-model matching moved {100 * moved:.1f} % of the residual, head and MLP units it may permute."
    )


def make(root: Path, out: Path) -> list[Path]:
    out = Path(out)
    records, checks = measure(Path(root))
    stats = summarise(records)
    header, rows, csv_rows = _table(stats)
    table = markdown(header, rows)
    caption = _caption(stats, len(checks["seeds"]))
    notes = [
        "Measured:",
        *findings(stats),
        "",
        "Cost: " + "; ".join(_timing(stats)) + ".",
        "",
        distances(records, checks["moved"]),
        "",
        f"Checks: every aligned B computes what B computes (largest relative deviation of the logits on a "
        f"test batch {checks['deviation']:.1e}); the endpoints read back from the cache score the test "
        f"accuracy their runs recorded to within {checks['accuracy_vs_runs']:.1e}.",
    ]
    columns = ["pair_kind", "scope", "matching", "merge", "pairs", "macro_f1", "macro_f1_se", "accuracy"]
    columns += ["accuracy_se", "match_seconds", "merge_seconds", "distance"]
    pair_columns = ["pair_kind", "pair", "scope", "matching", "merge", "macro_f1", "accuracy"]
    pair_columns += ["match_seconds", "merge_seconds", "distance"]
    per_pair = [
        [r["kind"], r["pair"], r["scope"], r["matching"], r["merge"], 100 * r["f1"], 100 * r["accuracy"]]
        + [r["match_seconds"], r["merge_seconds"], r["distance"]]
        for r in records
    ]
    files = [
        atomic_write_text(out / "roberta_finetune.md", f"{table}\n\n{caption}\n"),
        write_csv(out / "roberta_finetune.csv", columns, csv_rows),
        write_csv(out / "roberta_finetune_pairs.csv", pair_columns, per_pair),
    ]
    body = (
        f"{table}\n\n{caption}\n\n" + "\n".join(notes) + "\n\nFiles: [roberta_finetune.md](roberta_finetune.md), "
        "[roberta_finetune.csv](roberta_finetune.csv), [roberta_finetune_pairs.csv](roberta_finetune_pairs.csv)."
    )
    return [*files, write_section(ARTEFACT, out, body)]


def _table(stats) -> tuple[list[str], list[list[str]], list[list[Any]]]:
    """The Markdown table's header and rows (one per row of ROWS, the pair kinds and merges as columns),
    and the CSV's rows (one per cell)."""
    header = ["scope", "matching"]
    header += [f"{KINDS[k]}: {m}" for k in KINDS for m in MERGES.values()] + ["s / pair"]
    rows, csv_rows = [], []
    for scope, matching in ROWS:
        row = list(row_label(scope, matching))
        for kind in KINDS:
            for merge in MERGES:
                s = stats[(kind, scope, matching, merge)]
                row.append(mean_pm(s["f1"], s["f1_se"], 1))
                csv_rows.append(
                    [kind, scope, matching, merge, s["pairs"], s["f1"], s["f1_se"], s["accuracy"], s["accuracy_se"]]
                    + [s["match_seconds"], s["merge_seconds"], s["distance"]]
                )
        spent = [stats[(k, scope, matching, "simple")]["match_seconds"] for k in KINDS]
        spent = [t for t in spent if t is not None]
        row.append("0" if scope == "none" else seconds(float(np.mean(spent))) if spent else "—")
        rows.append(row)
    return header, rows, csv_rows


def _timing(stats) -> list[str]:
    """Per scope, matching's seconds per pair against a Fisher and a RegMean merge's."""
    timing = []
    for scope, (label, _) in SCOPES.items():
        match = np.mean([stats[(k, scope, "rescaled", "simple")]["match_seconds"] for k in KINDS])
        fisher = np.mean([stats[(k, scope, "rescaled", "fisher")]["merge_seconds"] for k in KINDS])
        regmean = np.mean([stats[(k, scope, "rescaled", "regmean")]["merge_seconds"] for k in KINDS])
        timing.append(
            f"{label}: matching {seconds(match)} s per pair, {100 * match / fisher:.0f} % of a Fisher merge "
            f"({seconds(fisher)} s) and {100 * match / regmean:.0f} % of a RegMean merge ({seconds(regmean)} s)"
        )
    return timing


def _caption(stats, seeds: int) -> str:
    """The table's caption: what a cell, a column and a row are, with the pair counts."""
    pairs = {k: stats[(k, "none", "vanilla", "simple")]["pairs"] for k in KINDS}
    n = len(DATASETS)
    return (
        f"Macro-F1 (%) of merged pairs, mean ± s.e. over {pairs['same']} same-dataset pairs (one dataset, "
        f"seeds differ: {n} datasets × {seeds * (seeds - 1) // 2} seed pairs) and {pairs['cross']} cross-dataset "
        f"pairs (datasets differ, same seed: {n * (n - 1) // 2} dataset pairs × {seeds} seeds) of tiny RoBERTas "
        "fine-tuned from one pretrained masked-LM "
        "checkpoint on three topic-disjoint 4-label datasets. A cell is the mean of two scores, each with the "
        "classifier copied from the task's model (paper 002): the merged encoder with A's classifier on A's "
        "test set and with aligned B's on B's. Columns: simple = the midpoint average; Fisher = Fisher-"
        "weighted averaging; RegMean; each of A (the reference) and aligned B, every model's Fisher diagonal "
        "and Gram matrices taken on its own training data (merge.batches batches). Rows: endpoints, not "
        "merged = the two models' own macro-F1 (the upper reference, the same in every merge column); "
        "vanilla = B not aligned; then the rotation matcher in two scopes, attention only (paper 002: "
        "residual stream, heads and MLP left in place) and whole model (ours: residual stream, heads and MLP "
        "neurons permuted first), each with in-head permutations (the permutation baseline), rotations, and "
        "rotations + per-head rescaling (the matcher's result). s / pair: seconds to match one pair (rotation "
        "+ rescaling; the two rows above it come from the same call). Paper 002's in-domain column merges "
        "models of different emotion datasets: the cross-dataset columns are its counterpart. Accuracies: "
        "roberta_finetune.csv."
    )


ARTEFACT = Artefact(
    name="roberta_finetune",
    title="Paper 002, Table 1: merging fine-tuned RoBERTas with and without matching (macro-F1)",
    steps=STEPS,
    make=make,
)
