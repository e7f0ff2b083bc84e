"""Mean ± spread bands over seed pairs against any x (iterations, epochs, a swept setting); the
lambda-curve grids of Table 2 and Fig. 3 are glmc.report.band_grid."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display needed
import matplotlib.pyplot as plt
import numpy as np

from glmc.safe_files import atomic_path


def mean_spread(rows: Sequence[Sequence[float | None]], spread: str = "se") -> tuple[np.ndarray, np.ndarray]:
    """Column-wise mean and spread ("se" or "sd", ddof=1; 0 for a single value) of equal-length rows, one per
    seed pair, None as missing."""
    if spread not in ("se", "sd"):
        raise ValueError(f"spread={spread!r} is not one of se, sd")
    if not rows:
        raise ValueError("no rows to average")
    values = np.array([[np.nan if v is None else float(v) for v in row] for row in rows], dtype=float)
    n = np.sum(~np.isnan(values), axis=0)
    with warnings.catch_warnings():  # a column with one value (or none) has no spread: 0 (or NaN)
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.nanmean(values, axis=0)
        sd = np.where(n > 1, np.nanstd(values, axis=0, ddof=1), 0.0)
    return mean, sd / np.sqrt(np.maximum(n, 1)) if spread == "se" else sd


def band(ax, x: Sequence[float], rows: Sequence[Sequence[float | None]], label: str, spread: str = "se", **style):
    """The mean line over the rows with a shaded mean ± spread band; returns (mean, spread)."""
    mean, width = mean_spread(rows, spread)
    (line,) = ax.plot(x, mean, marker="o", markersize=3, label=label, **style)
    ax.fill_between(x, mean - width, mean + width, color=line.get_color(), alpha=0.2, linewidth=0)
    return mean, width


def save(fig, path: Path) -> Path:
    """Write the figure atomically (a half-written PNG never replaces a good one) and close it."""
    fig.tight_layout()
    with atomic_path(Path(path)) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)
    return Path(path)


def at_lambda(values: Sequence[Any], lambdas: Sequence[float], lam: float) -> Any:
    """The value at the grid point nearest `lam` (run.py's grids hold 0, 0.5 and 1)."""
    return values[int(np.argmin(np.abs(np.asarray(lambdas, dtype=float) - lam)))]
