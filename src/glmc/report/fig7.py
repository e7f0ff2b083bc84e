"""Paper 001 Fig. 7 (Appendix C.2): the barrier per number of weight-matching iterations (max_iter), with an
orthogonal (`weight`) and a permuted (`weight_perm`) residual map; one grid job per (max_iter, method) on the
same endpoints. A run that converges earlier stops, so the table gives the iterations actually run."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import MaxNLocator

from glmc.eval.bands import band, save
from glmc.report.artefact import Artefact, Step
from glmc.report.results import grid_results
from glmc.report.section import write_section
from glmc.report.tables import markdown, mean_pm, number, write_csv

# --tiny: two pairs of debug-sized models, one and two iterations
STEP = Step(
    label="fig7_iterations",
    overrides=("experiment=fig7_iterations", "sweep=fig7"),
    multirun=True,
    tiny=("seeds=[0,1,2,3]", "matcher.weight.max_iter=1,2"),
)
LINES = {"weight": "orthogonal residual (weight)", "weight_perm": "permuted residual (weight_perm)"}


def collect(folder: Path) -> dict[str, dict[int, list[dict]]]:
    """method -> max_iter -> that job's per-pair results."""
    out: dict[str, dict[int, list[dict]]] = defaultdict(dict)
    for results in grid_results(folder):
        for method, summary in results["methods"].items():
            if method not in LINES:
                continue
            max_iter = int(results["config"]["matcher"][method]["max_iter"])
            if max_iter in out[method]:
                raise ValueError(f"{folder}: two jobs ran {method} with max_iter={max_iter}")
            out[method][max_iter] = summary["pairs"]
    if not out:
        raise ValueError(f"no job in {folder} ran {' or '.join(LINES)}")
    return dict(out)


def make(root: Path, out: Path) -> list[Path]:
    out = Path(out)
    data = collect(Path(root) / STEP.label)
    fig, ax = plt.subplots(figsize=(5.2, 3.5))
    cells: dict[int, dict[str, str]] = defaultdict(dict)
    csv_rows = []
    n_pairs = 0
    for method, label in LINES.items():
        if method not in data:
            continue
        iters = sorted(data[method])
        # one row per seed pair, one column per max_iter; pairs are matched by their seeds
        by_seeds = {it: {tuple(p["seeds"]): p for p in data[method][it]} for it in iters}
        seeds = sorted({s for pairs in by_seeds.values() for s in pairs})
        rows = [[by_seeds[it][s]["barrier"] if s in by_seeds[it] else None for it in iters] for s in seeds]
        mean, se = band(ax, iters, rows, label)
        n_pairs = max(n_pairs, len(seeds))
        for i, it in enumerate(iters):
            ran = float(np.mean([p["diagnostics"]["iterations"] for p in data[method][it]]))
            cells[it][method] = mean_pm(mean[i], se[i] if len(data[method][it]) > 1 else None)
            cells[it][method + " ran"] = number(ran, 1)
            csv_rows.append([method, it, len(data[method][it]), mean[i], se[i], ran])
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("weight-matching iterations (max_iter)")
    ax.set_ylabel("test-loss barrier (nats)")
    ax.set_title(f"mean ± s.e. over {n_pairs} seed pairs", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    figure = save(fig, out / "fig7.png")
    csv = write_csv(
        out / "fig7.csv", ["method", "max_iter", "pairs", "barrier", "barrier_se", "iterations_run"], csv_rows
    )
    columns = ["weight", "weight ran", "weight_perm", "weight_perm ran"]
    table = markdown(
        ["max_iter", "barrier, orthogonal", "iterations run", "barrier, permutation", "iterations run"],
        [[str(it), *(row.get(c, "—") for c in columns)] for it, row in sorted(cells.items())],
    )
    body = (
        "![Fig. 7: barrier per weight-matching iteration, orthogonal vs permuted residual](fig7.png)\n\n"
        f"{table}\n\n"
        "Test-loss barrier (nats), mean ± s.e. over the disjoint seed pairs; iterations run: the mean over the "
        "pairs (weight matching stops once its weight-space objective no longer improves). "
        "Files: [fig7.csv](fig7.csv)."
    )
    return [figure, csv, write_section(ARTEFACT, out, body)]


ARTEFACT = Artefact(
    "fig7", "Fig. 7: barrier per weight-matching iteration, orthogonal vs permuted residual", (STEP,), make
)
