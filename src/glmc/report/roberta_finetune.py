"""Paper 002's Table 1 at CPU size: tiny RoBERTas fine-tuned from one pretrained (masked-LM) parent on three
topic-disjoint datasets of one 4-label task (data=pydoc_topics), merged pairwise.

Two runs of `experiment=roberta_finetune` (endpoints=finetuned: glmc.pipeline.children) align, merge and score
every pair: the first with vanilla and the rotation matcher in paper 002's scope (attention only), the second
with the whole model in scope (ours: residual stream, heads and MLP permuted first; the children read from the
cache). The rotation matcher's variants give three rows per scope: in-head permutations, rotations, rotations
+ rescaling. `make` reads the two results.json files. Paper 002's "in-domain" column merges models of different
emotion datasets: our cross-dataset pairs (same seed) are its counterpart; same-dataset pairs (seeds differ)
add what seeds alone do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

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
    "seeds=[0,1]",  # one seed pair per dataset: 3 same-dataset and 3 cross-dataset pairs
)
WHOLE = ("matcher.methods=[rotation]",) + tuple(
    f"matcher.rotation.{space}=permutation" for space in ("residual", "heads", "mlp")
)
STEPS = (
    Step(label="roberta_finetune", overrides=("experiment=roberta_finetune",), tiny=TINY),
    Step(label="roberta_finetune_whole", overrides=("experiment=roberta_finetune", *WHOLE), tiny=TINY),
)

SCOPES = {  # scope -> (label, the step whose rotation records it reads)
    "attention": ("attention only (paper 002)", STEPS[0].label),
    "whole": ("whole model (ours)", STEPS[1].label),
}
MATCHINGS = {  # row -> (label, the rotation matcher's variant; main: its result)
    "permutation": ("in-head permutation", "head_permutation"),
    "rotation": ("rotation", "no_rescale"),
    "rescaled": ("rotation + rescaling", "main"),
}
MERGES = {"simple": "simple", "fisher": "Fisher", "regmean": "RegMean"}
KINDS = {"same": "same dataset", "cross": "cross-dataset"}


def _records(children: list[dict[str, Any]], scope: str) -> list[dict[str, Any]]:
    """The table's records of one run's: `scope`'s rotation rows and, from the first run, the endpoints (the
    same in every merge column) and vanilla; the run's midpoint average is the table's simple merge."""
    rows = {("rotation", variant): (scope, matching) for matching, (_, variant) in MATCHINGS.items()}
    if scope == "attention":
        rows.update({("vanilla", "main"): ("none", "vanilla"), ("endpoints", None): ("endpoints", "endpoints")})
    out, unmeasured = [], dict.fromkeys(("match_seconds", "merge_seconds", "distance"))
    for r in children:
        row = rows.get((r["method"], r.get("variant")))
        merges = [{"average": "simple"}.get(r["merge"], r["merge"])] if "merge" in r else list(MERGES)
        out += [{**unmeasured, **r, "scope": row[0], "matching": row[1], "merge": m} for m in merges] if row else []
    return out


def measure(root: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One record per (pair, row, merge), in pair order, from the two runs' results.json; plus checks
    for the text."""
    runs = {scope: run_results(Path(root) / label) for scope, (_, label) in SCOPES.items()}
    records = [r for scope, results in runs.items() for r in _records(results["children"], scope)]
    pairs = {p: i for i, p in enumerate(dict.fromkeys(r["pair"] for r in records))}
    rows, merges = {row: i for i, row in enumerate(ROWS)}, list(MERGES)
    records.sort(key=lambda r: (pairs[r["pair"]], rows[(r["scope"], r["matching"])], merges.index(r["merge"])))
    accuracy = [[e["test_accuracy"] for e in results["endpoints"]] for results in runs.values()]
    moved = [r["moved"] for r in records if r["scope"] == "whole" and r.get("moved") is not None]
    checks = {
        "deviation": max(r.get("deviation") or 0.0 for r in records if r["scope"] in SCOPES),
        "accuracy_vs_runs": max(abs(x - y) for x, y in zip(*accuracy)),  # the second run read the first's children
        "seeds": list(runs["attention"]["config"]["seeds"]),
        "moved": float(np.mean(moved)) if moved else 0.0,
    }
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
        f"test batch {checks['deviation']:.1e}); the second run's endpoints, read back from the cache, score "
        f"the first run's test accuracy to within {checks['accuracy_vs_runs']:.1e}.",
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
