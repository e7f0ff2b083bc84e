"""Task scores along paths: a panel per task metric, a line per method with lm-eval's standard error as a
band, and the straight line between each path's end scores dotted (the barrier is the largest gap below it,
above it for a score that should be low)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display needed
import matplotlib.pyplot as plt
import numpy as np

from glmc.safe_files import atomic_path


def plot_task_curves(
    path: Path, lambdas: Sequence[float], panels: Mapping[str, Mapping[str, Any]], title: str | None = None
) -> Path:
    """`panels`: panel title ("task/metric") -> line label -> {"values", "stderr" (a list or one number),
    "barrier"}; lambda = 1 is A."""
    if not panels:
        raise ValueError(f"{path}: nothing to plot")
    lam = np.asarray(lambdas, dtype=float)
    size = (4.2 * len(panels) + 0.5, 3.4)
    fig, axes = plt.subplots(1, len(panels), figsize=size, squeeze=False, layout="constrained")
    for ax, (name, lines) in zip(axes.flat, panels.items()):
        for label, entry in lines.items():
            y = np.asarray(entry["values"], dtype=float)
            (drawn,) = ax.plot(lam, y, marker="o", ms=3, label=f"{label} (barrier {entry['barrier']:.3f})")
            se = entry.get("stderr")
            if isinstance(se, Sequence) and all(s is not None for s in se):
                ax.fill_between(lam, y - np.asarray(se), y + np.asarray(se), color=drawn.get_color(), alpha=0.15)
            ends = y[int(np.argmin(lam))], y[int(np.argmax(lam))]
            ax.plot([lam.min(), lam.max()], ends, ls=":", color=drawn.get_color(), lw=1)
        ax.set_xlabel("lambda (1 = A)", fontsize=8)
        ax.set_title(name, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6)
    if title:
        fig.suptitle(title, fontsize=10)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return path
