"""Turn a run or multirun folder into a barrier table (markdown) and one figure.

    .venv/bin/python experiments/summarize.py multirun/<experiment>/<time> [--out summary]

Every results.json below the folder contributes its seed pairs; pairs are pooled per
(experiment, model, dataset, method, settings), where `settings` names every config value that differs
between runs of the same method (a grid over data.seq_len gives one row per length), so a sweep over
seeds gives mean ± s.e. over all of them (the same seed pair evaluated by several runs counts once).
Jobs that started but wrote no results (failed, or still running) are listed under the table, and so is
every results.json that cannot be read (named, the other runs still summarized). A spawn run
(endpoints=spawn) has barriers per spawn step, not seed pairs: its own table follows the pooled one.
Writes <out>.md and <out>.png next to the folder unless --out says otherwise.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from glmc.eval.barrier_plot import plot_barrier_curves
from glmc.report.results import collect_runs, mean_se, unfinished_jobs


def table(pooled) -> str:
    vanilla = {(*k[:3], k[4]): mean_se([p["barrier"] for p in v])[0] for k, v in pooled.items() if k[3] == "vanilla"}
    lines = [
        "| experiment | model | dataset | method | settings | pairs | barrier | ratio to vanilla | barrier vs mean |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (exp, model, data, method, shared, own), pairs in sorted(pooled.items()):
        b, se = mean_se([p["barrier"] for p in pairs])
        bm, _ = mean_se([p["barrier_vs_mean"] for p in pairs])
        base = vanilla.get((exp, model, data, shared))
        ratio = f"{b / base:.3f}" if base else "-"
        spread = f" ± {se:.3f}" if se is not None else ""
        shown = ", ".join(s for s in (shared, own) if s) or "-"
        lines.append(
            f"| {exp} | {model} | {data} | {method} | {shown} | {len(pairs)} | {b:.3f}{spread} | {ratio} | {bm:.3f} |"
        )
    return "\n".join(lines)


def failures(folder: Path) -> str:
    """The jobs below `folder` without results, one line each (empty when every job finished)."""
    jobs = unfinished_jobs(folder)
    return "\n".join([f"\n{len(jobs)} jobs without results:", *(f"- {j}" for j in jobs)]) if jobs else ""


def spawn_tables(spawn: list) -> str:
    """Each spawn run's barrier per spawn step k (its own table: pairs of one k are not seed pairs)."""
    from glmc.pipeline.children import format_spawn  # the table a spawn run prints

    parts = []
    for path, results in spawn:
        try:
            parts.append(f"\n\nspawn run {path}:\n" + format_spawn(results))
        except (KeyError, IndexError, TypeError, ValueError) as err:  # a spawn record without its barriers
            parts.append(f"\n\nspawn run {path}: no barriers per step to show ({type(err).__name__}: {err})")
    return "".join(parts)


def skipped(lines: list[str]) -> str:
    return "\n".join([f"\n\n{len(lines)} results.json left out:", *(f"- {line}" for line in lines)]) if lines else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    try:
        found = collect_runs(args.folder)
    except FileNotFoundError as err:
        raise SystemExit(str(err)) from err
    pooled, out = found.pooled, args.out or args.folder / "summary"
    text = table(pooled) if pooled else f"no seed pairs below {args.folder}"
    text += spawn_tables(found.spawn) + skipped(found.skipped) + failures(args.folder)
    out.with_suffix(".md").write_text(text + "\n")
    curves = {}
    for (_, _, _, method, *settings), pairs in pooled.items():
        label = ", ".join(s for s in settings if s)
        curves[f"{method} ({label})" if label else method] = {
            "lambdas": pairs[0]["lambdas"],
            "test_loss": list(np.mean([p["test_loss"] for p in pairs], axis=0)),
            "test_accuracy": list(np.mean([p["test_accuracy"] for p in pairs], axis=0))
            if all(None not in p["test_accuracy"] for p in pairs)
            else [None] * len(pairs[0]["lambdas"]),
            "barrier": mean_se([p["barrier"] for p in pairs])[0],
        }
    print(text)
    if not curves:  # only spawn runs, or none readable: no seed pairs to draw
        print(f"\nwrote {out.with_suffix('.md')} (no seed pairs: no figure)")
        return
    plot_barrier_curves(curves, out.with_suffix(".png"), title=f"mean over pairs: {args.folder.name}")
    print(f"\nwrote {out.with_suffix('.md')} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
