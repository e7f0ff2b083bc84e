"""The loss over a plane through three models (glmc.eval.plane) as a contour plot, the models marked and the
straight paths between them drawn."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display needed
import matplotlib.pyplot as plt
import numpy as np

from glmc.safe_files import atomic_path


def plot_plane(
    record: dict[str, Any],
    path: Path,
    names: Sequence[str] = ("A", "B", "aligned B"),
    segments: Sequence[tuple[int, int]] = ((0, 1), (0, 2)),
    title: str = "",
) -> Path:
    """Writes a PNG of `record`'s loss (x, y, loss by [row y][column x], the models' coords) with the
    models named `names` marked and the segments between models (index pairs) drawn."""
    loss = np.array(record["loss"], dtype=float)
    finite = loss[np.isfinite(loss)]
    fig, ax = plt.subplots(figsize=(5.6, 4.6), layout="constrained")
    if finite.size:  # levels spaced evenly in log loss over the lattice's range: the basin and the walls both show
        low, high = float(finite.min()), float(finite.max())
        high = max(high, low + 1e-6 * max(abs(low), 1.0))  # a flat plane still gets its levels
        levels = np.geomspace(low, high, 16) if low > 0 else np.linspace(low, high, 16)
        shown = ax.contourf(record["x"], record["y"], np.clip(loss, low, high), levels=levels, cmap="viridis")
        fig.colorbar(shown, ax=ax, label="loss (nats)", format="%.4g")
    coords = np.array(record["coords"], dtype=float)
    for i, j in segments:
        ax.plot(*coords[[i, j]].T, color="white", lw=1.5, ls="--")
    ax.scatter(*coords.T, s=60, color="black", edgecolor="white", zorder=5)
    middle = float(np.mean(record["x"]))
    for (x, y), name, own in zip(coords, names, record.get("model_loss", [math.nan] * len(names))):
        right = x > middle  # labelled towards the centre, inside the axes
        offset, align = ((-6, 6), "right") if right else ((6, 6), "left")
        ax.annotate(f"{name} ({own:.4g})", (x, y), textcoords="offset points", xytext=offset, ha=align, color="white")
    ax.set_xlabel("u")
    ax.set_ylabel("v")
    ax.set_aspect("equal", adjustable="box")  # distances in the plane as they are
    if title:
        ax.set_title(title, fontsize=9)
    with atomic_path(Path(path)) as tmp:  # a half-written PNG never replaces a good one
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)
    return Path(path)
