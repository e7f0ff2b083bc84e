"""Layer-wise barriers as heatmaps: per path, part x lambda (the loss above the line between the curve's
ends, whose highest value is the part's barrier); per run, part x method (the barriers)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display needed
import matplotlib.pyplot as plt
import numpy as np

from glmc.safe_files import atomic_path

# panel title -> (row labels, column labels, rows of values)
Panel = tuple[Sequence[str], Sequence[str], Sequence[Sequence[float | None]]]
HELD_TITLES = {"held_at_a": "rest held at A", "held_at_b": "rest held at B"}


def plot_heatmaps(
    path: Path, panels: Mapping[str, Panel], label: str, xlabel: str = "", title: str | None = None
) -> Path:
    """One PNG, a heatmap per panel side by side on one colour scale (0 to the largest value), the value
    written in each cell while the grid is small enough to read; `label` names the colour scale."""
    if not panels:
        raise ValueError(f"{path}: nothing to plot")
    grids = {name: np.array([[np.nan if v is None else v for v in row] for row in rows], dtype=float)
             for name, (_, _, rows) in panels.items()}  # fmt: skip
    finite = [v for g in grids.values() for v in g.flat if math.isfinite(v)]
    top, bottom = max(finite + [1e-12]), min(finite + [0.0])
    rows, cols = max(len(p[0]) for p in panels.values()), max(len(p[1]) for p in panels.values())
    width, height = 1.2 + 0.45 * max(cols, 4), 1.2 + 0.32 * max(rows, 3)
    fig, axes = plt.subplots(
        1, len(panels), figsize=(width * len(panels) + 1, height), squeeze=False, layout="constrained"
    )
    for ax, (name, (row_labels, col_labels, _)) in zip(axes.flat, panels.items()):
        grid = grids[name]
        image = ax.imshow(grid, vmin=bottom, vmax=top, cmap="viridis", aspect="auto")
        slanted = max(map(len, col_labels)) * len(col_labels) > 30  # labels that would overlap level
        ax.set_xticks(
            range(len(col_labels)),
            col_labels,
            fontsize=7,
            rotation=45 if slanted else 0,
            ha="right" if slanted else "center",
        )
        ax.set_xlabel(xlabel, fontsize=8)
        ax.set_yticks(range(len(row_labels)), row_labels, fontsize=7)
        ax.set_title(name, fontsize=9)
        if grid.size <= 120:
            for (i, j), v in np.ndenumerate(grid):
                ink = "k" if v > bottom + 0.6 * (top - bottom) else "w"
                ax.text(j, i, "—" if np.isnan(v) else f"{v:.2g}", ha="center", va="center", fontsize=6, color=ink)
    fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label=label)
    if title:
        fig.suptitle(title, fontsize=10)
    with atomic_path(Path(path)) as tmp:  # a half-written PNG never replaces a good one
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return Path(path)


def excess(lambdas: Sequence[float], losses: Sequence[float]) -> list[float]:
    """The loss above the straight line between the curve's own ends (lam = 1 and lam = 0)."""
    lam, loss = np.asarray(lambdas, float), np.asarray(losses, float)
    line = lam * loss[np.argmax(lam)] + (1 - lam) * loss[np.argmin(lam)]
    return (loss - line).tolist()


def plot_layerwise(path: Path, record: dict[str, Any], title: str | None = None) -> Path:
    """A layerwise_barriers record as part x lambda heatmaps: one per held end (and per cumulative one)."""
    lambdas = record["lambdas"]
    columns = [f"{lam:g}" for lam in lambdas]
    panels: dict[str, Panel] = {}
    for prefix, source in (("", record), ("cumulative, ", record.get("cumulative") or {})):
        for key, what in HELD_TITLES.items():
            if key in source:
                parts = record["parts"] if not prefix else [f"..{p}" for p in record["parts"]]
                rows = [f"{p} ({b:.2g})" for p, b in zip(parts, source[key]["barrier"])]
                panels[prefix + what] = (rows, columns, [excess(lambdas, loss) for loss in source[key]["loss"]])
    return plot_heatmaps(path, panels, "loss above the ends' line", "λ (1 = A, 0 = B)", title)
