"""N x N barrier matrices as heatmaps: one panel per method, every cell's barrier written in it."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display needed
import matplotlib.pyplot as plt
import numpy as np

from glmc.safe_files import atomic_path

Matrix = tuple[Sequence[str], Sequence[Sequence[float | None]]]  # (labels, rows)


def plot_barrier_matrices(path: Path, panels: Mapping[str, Matrix], title: str | None = None) -> Path:
    """Writes one PNG with a heatmap per entry of `panels` (panel title -> (labels, matrix)), all on one
    colour scale from 0 to the largest barrier, so panels compare at a glance."""
    if not panels:
        raise ValueError(f"{path}: no barrier matrix to plot")
    values = [v for _, rows in panels.values() for row in rows for v in row if v is not None and math.isfinite(v)]
    top = max(values + [1e-12])
    cols = min(len(panels), 3)
    nrows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(3.4 * cols + 0.8, 3.1 * nrows), squeeze=False, layout="constrained")
    for ax, (name, (labels, rows)) in zip(axes.flat, panels.items()):
        grid = np.array([[np.nan if v is None else v for v in row] for row in rows], dtype=float)
        image = ax.imshow(grid, vmin=min(0.0, np.nanmin(grid)), vmax=top, cmap="viridis")
        ax.set_xticks(range(len(labels)), labels, fontsize=7, rotation=45)
        ax.set_yticks(range(len(labels)), labels, fontsize=7)
        ax.set_title(name, fontsize=9)
        if len(labels) <= 8:  # a readable number per cell
            for (i, j), v in np.ndenumerate(grid):
                ink = "k" if v > 0.6 * top else "w"  # dark on viridis' bright end
                ax.text(j, i, "—" if np.isnan(v) else f"{v:.2g}", ha="center", va="center", fontsize=6, color=ink)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label="test-loss barrier (nats)")
    if title:
        fig.suptitle(title, fontsize=10)
    with atomic_path(Path(path)) as tmp:  # a half-written PNG never replaces a good one
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)
    return Path(path)
