"""Stage 4, what a run writes: results.json, barrier.csv, barrier.png and a printed table.

results.json is strict JSON: NaN and infinities (a diverged path, an empty metric) are written as
null. Every file is written atomically (a temporary file renamed into place).
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from glmc.eval.barrier_plot import plot_barrier_curves
from glmc.metrics import is_token_task
from glmc.safe_files import atomic_path, atomic_write_text


def finite_or_none(value: Any) -> Any:
    """A copy of nested dicts/lists/tuples with every NaN or infinite float replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(v) for v in value]
    return value


class ResultsNotWritten(OSError):
    """Some result files could not be written (a full disk, a folder turned read-only); the message
    says which were written, which were not, and why."""


def config_as_saved(cfg: Any) -> dict[str, Any]:
    """The resolved config as results.json stores it (plain JSON values)."""
    return json.loads(json.dumps(finite_or_none(OmegaConf.to_container(cfg, resolve=True))))


def write_results(results: dict[str, Any], run_dir: Path) -> None:
    """results.json, then (pairwise runs) barrier.csv and barrier.png. Each file is tried even when an
    earlier one failed; ResultsNotWritten afterwards names both kinds."""
    run_dir.mkdir(parents=True, exist_ok=True)
    files = {"results.json": lambda: _write_json(results, run_dir / "results.json")}
    if results["methods"]:  # a multi-model run: its simplex table and picture are written by glmc.pipeline.multi
        files["barrier.csv"] = lambda: _write_csv(results, run_dir / "barrier.csv")
        files["barrier.png"] = lambda: _write_plot(results, run_dir / "barrier.png")
    written, failed = [], []
    for name, write in files.items():
        try:
            write()
            written.append(name)
        except OSError as err:
            failed.append(f"{name} ({err.strerror or err})")
    if failed:
        raise ResultsNotWritten(
            f"in {run_dir}, wrote {', '.join(written) or 'nothing'}; could not write {', '.join(failed)}: free space "
            "or make the folder writable, then run the same command again (cached endpoints are reused)"
        )


def _write_json(results: dict[str, Any], path: Path) -> None:
    atomic_write_text(path, json.dumps(finite_or_none(results), indent=2, allow_nan=False))


def _write_csv(results: dict[str, Any], path: Path) -> None:
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.writer(f)
        tasks = results.get("tasks") or {}  # eval.tasks: each task metric's mean curve over pairs
        columns = list(dict.fromkeys(c for cells in tasks.values() for c in cells))
        writer.writerow(["method", "lambda", "split", "loss", "accuracy", *columns])
        for name, m in results["methods"].items():
            for i, (lam, loss, acc) in enumerate(zip(m["lambdas"], m["test_loss"], m["test_accuracy"])):
                scores = [tasks.get(name, {}).get(c, {}).get("values", [None] * (i + 1))[i] for c in columns]
                writer.writerow([name, lam, results.get("split", "test"), loss, acc, *scores])


def _write_plot(results: dict[str, Any], path: Path) -> None:
    title = f"{results['model']} on {results['dataset']}"  # endpoints=pretrained: the model names its folders
    if not any("name" in e for e in results["endpoints"]):
        title += f", seeds {[e['seed'] for e in results['endpoints']]}"
    with atomic_path(path) as tmp:
        plot_barrier_curves(results["methods"], tmp, title=title)


def format_table(results: dict[str, Any]) -> str:
    """The endpoints and one row per method; language models show perplexity where images show accuracy."""
    lm = is_token_task(results.get("task", ""))
    lines = ["endpoints:"]
    for e in results["endpoints"]:
        if lm:
            quality = f"perplexity {math.exp(e['test_loss']):.2f}"
        else:
            quality = "accuracy " + ("-" if e["test_accuracy"] is None else f"{100 * e['test_accuracy']:.2f}%")
        who = e["name"] if "name" in e else f"seed {e['seed']:>3}"  # endpoints=pretrained: the folder's name
        kept = f"  (epoch {e['kept']['epoch']}, the best)" if e.get("kept") else ""  # early stopping's choice
        cached = "  (cached)" if e.get("cached") else ""
        lines.append(f"  {who}  test loss {e['test_loss']:.4f}  {quality}{kept}{cached}")
    third = "mid ppl" if lm else "mid acc"
    header = f"{'method':<18}{'barrier':>16}{'vs mean':>10}{'mid loss':>10}{third:>9}{'seconds':>9}"
    lines += ["", header, "-" * len(header)]
    for name, m in results["methods"].items():
        mid = len(m["lambdas"]) // 2
        spread = f" ± {m['barrier_se']:.3f}" if m.get("barrier_se") is not None else ""
        b = f"{m['barrier']:.4f}{spread}"
        acc = m["test_accuracy"][mid]
        if lm:
            quality = f"{math.exp(m['test_loss'][mid]):.2f}"
        else:
            quality = "-" if acc is None else f"{100 * acc:.1f}%"
        lines.append(
            f"{name:<18}{b:>16}{m['barrier_vs_mean']:>10.4f}{m['test_loss'][mid]:>10.4f}{quality:>9}{m['seconds']:>9.2f}"
        )
    summary = summary_line(results["methods"])
    return "\n".join(lines + ([summary] if summary else []))


# the methods the summary line speaks of, in the order of paper 001's story
SUMMARY_METHODS = {"weight_perm": "permutations alone", "weight": "weight matching", "learned": "learned matching"}


def summary_line(methods: dict[str, Any]) -> str | None:
    """One line saying how much of the vanilla barrier each alignment removed, e.g. "Of the vanilla
    barrier (0.829), weight matching removed 91 %, learned matching 97 %."; None without a positive
    vanilla barrier or without those methods."""
    base = methods.get("vanilla", {}).get("barrier")
    if base is None or not math.isfinite(base) or base <= 0:
        return None
    removed = [
        (label, 100 * (1 - methods[name]["barrier"] / base))
        for name, label in SUMMARY_METHODS.items()
        if name in methods and methods[name].get("barrier") is not None
    ]
    if not removed:
        return None
    said = [f"{label} {'removed ' if i == 0 else ''}{share:.0f} %" for i, (label, share) in enumerate(removed)]
    return f"Of the vanilla barrier ({base:.3f}), " + ", ".join(said) + "."
