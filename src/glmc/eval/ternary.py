"""The loss over the simplex of three models as ternary heatmaps (paper 001 Fig. 4): one panel per
method, coloured by the excess loss over the linear baseline on one colour scale shared by all."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display needed
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import Normalize
from matplotlib.tri import Triangulation

from glmc.eval.simplex import excess_losses

# corners of the triangle: model 0 bottom left, model 1 bottom right, model 2 on top
CORNERS = np.array([[0.0, 0.0], [1.0, 0.0], [0.5, math.sqrt(3) / 2]])
LABEL_OFFSETS = ((0, -8), (0, -8), (0, 6))  # corner labels, offset in typographic points


def to_cartesian(points: Sequence[Sequence[float]]) -> np.ndarray:
    """Barycentric points of three models -> (x, y) in the triangle CORNERS."""
    pts = np.asarray(points, float)
    if pts.ndim != 2 or pts.shape[1] != 3:
        raise ValueError(f"ternary plots take points of three models, got shape {pts.shape}")
    return pts @ CORNERS


def _excess(panel: dict[str, Any]) -> np.ndarray:
    if "excess" in panel:
        return np.asarray(panel["excess"], float)
    return excess_losses(panel["points"], panel["test_loss"], panel["endpoint_loss"])


def plot_simplex_heatmaps(
    panels: dict[str, dict[str, Any]],
    path: str | Path,
    title: str | None = None,
    labels: Sequence[str] | None = None,
) -> Path:
    """One ternary panel per method, coloured by L - sum_i a_i L_i; `labels` name the corners."""
    if not panels:
        raise ValueError("no panels to plot")
    labels = list(labels) if labels is not None else ["θ₀", "θ₁", "θ₂"]
    if len(labels) != 3:
        raise ValueError(f"{len(labels)} corner labels for three models")
    coords = {name: to_cartesian(p["points"]) for name, p in panels.items()}
    excess = {name: _excess(p) for name, p in panels.items()}
    vmin = min(float(e.min()) for e in excess.values())
    vmax = max(float(e.max()) for e in excess.values())
    if vmax - vmin < 1e-12:
        vmin, vmax = vmin - 1e-6, vmax + 1e-6
    levels = np.linspace(vmin, vmax, 21)
    if vmin < 0 < vmax:  # both signs: a diverging scale symmetric about 0, so white is the baseline
        bound = max(-vmin, vmax)
        norm, cmap = Normalize(-bound, bound), "RdBu_r"
        levels = np.union1d(levels, [0.0])
    else:
        norm, cmap = Normalize(vmin, vmax), "viridis"

    fig, axes = plt.subplots(
        1, len(panels), figsize=(3.6 * len(panels) + 1.2, 3.8), squeeze=False, layout="constrained"
    )
    axes = axes[0]
    outline = np.vstack([CORNERS, CORNERS[:1]])
    for ax, (name, panel) in zip(axes, panels.items()):
        xy, values = coords[name], excess[name]
        try:
            ax.tricontourf(Triangulation(xy[:, 0], xy[:, 1]), values, levels=levels, cmap=cmap, norm=norm)
        except (ValueError, RuntimeError):  # too few points for a triangulation
            pass
        ax.scatter(xy[:, 0], xy[:, 1], c=values, cmap=cmap, norm=norm, s=10, edgecolors="k", linewidths=0.2)
        best = int(np.argmax(values))
        ax.scatter(*xy[best], marker="*", s=120, color="gold", edgecolors="k", linewidths=0.6, zorder=5)
        ax.plot(outline[:, 0], outline[:, 1], color="black", linewidth=1)
        for corner, label, offset, va in zip(CORNERS, labels, LABEL_OFFSETS, ("top", "top", "bottom")):
            ax.annotate(label, corner, textcoords="offset points", xytext=offset, ha="center", va=va, fontsize=9)
        barrier = panel.get("barrier", float(values.max()))
        ax.set_title(f"{name} (barrier {barrier:.3f})", fontsize=10)
        ax.set_xlim(-0.08, 1.08)
        ax.set_ylim(-0.1, CORNERS[2, 1] + 0.1)
        ax.set_aspect("equal")
        ax.axis("off")
    mappable = plt.cm.ScalarMappable(norm=norm, cmap=cmap)
    bar = fig.colorbar(mappable, ax=list(axes), shrink=0.8, label="loss − linear baseline (nats)")
    bar.ax.set_ylim(vmin, vmax)  # only the range the panels reach
    if title:
        fig.suptitle(title)
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
