"""The barrier against any x (a training step, the spawn step k, a swept setting) for every method on one
figure, with the endpoints' losses on a second axis: connectivity and how far training had got, side by side."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib.pyplot as plt

from glmc.eval.bands import band, save

Rows = Sequence[Sequence[float | None]]


def plot_barrier_against(
    path: Path,
    x: Sequence[float],
    barriers: Mapping[str, Rows],
    losses: Mapping[str, Rows] | None = None,
    xlabel: str = "training step",
    title: str | None = None,
    log_x: bool = False,
) -> Path:
    """Writes one PNG: per method (`barriers`: method -> rows) the barrier against `x`, solid on the left
    axis; per label (`losses`: e.g. "endpoint test loss" -> rows) a loss against `x`, dashed on the right.

    Every row holds one value per x (None: missing), one row per pair (barriers) or per endpoint (losses);
    several rows are drawn as their mean with a ± s.e. band. `log_x` gives a symlog x axis (k = 0 stays)."""
    if not barriers:
        raise ValueError(f"{path}: no method's barriers to plot")
    for name, rows in [*barriers.items(), *(losses or {}).items()]:
        short = [len(row) for row in rows if len(row) != len(x)]
        if not rows or short:
            raise ValueError(f"{path}: {name!r} needs rows of {len(x)} values, one per x; got {short or 'no rows'}")
    fig, ax = plt.subplots(figsize=(6.0, 3.8))
    for method, rows in barriers.items():
        band(ax, x, rows, method)
    ax.axhline(0.0, color="black", linewidth=0.6, alpha=0.5)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("test-loss barrier (nats)")
    if log_x:
        ax.set_xscale("symlog", linthresh=1.0)
    handles, labels = ax.get_legend_handles_labels()
    if losses:
        right = ax.twinx()
        for i, (label, rows) in enumerate(losses.items()):
            band(right, x, rows, label, linestyle="--", color=f"{0.2 + 0.25 * (i % 3):.2f}")
        right.set_ylabel("endpoint loss (nats)")
        more = right.get_legend_handles_labels()
        handles, labels = handles + more[0], labels + more[1]
    ax.legend(handles, labels, fontsize=8)
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(title, fontsize=10)
    return save(fig, Path(path))
