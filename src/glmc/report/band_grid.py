"""Mean curves with s.e. bands on a grid of panels (a column per task, a row per metric); a group's lines
(a method's) keep one colour in every panel and differ by line style within one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display needed
import matplotlib.pyplot as plt

from glmc.eval.bands import save
from glmc.report.results import Curve

STYLES = ("-", "--", ":", "-.")
LAMBDA_LABEL = "λ   (θ = λ·θ_A + (1−λ)·θ_B)"


@dataclass(frozen=True)
class Panel:
    title: str
    ylabel: str
    curves: Sequence[Curve]


def plot_band_grid(columns: Sequence[Sequence[Panel]], path: Path, title: str = "") -> Path:
    """`columns[c][r]` is the panel in column c, row r; every column has the same number of rows."""
    n_rows = max(len(col) for col in columns)
    fig, axes = plt.subplots(n_rows, len(columns), figsize=(max(6.0, 5.0 * len(columns)), 3.6 * n_rows), squeeze=False)
    groups: list[str] = []  # colours in order of first appearance, shared by all panels
    for c, column in enumerate(columns):
        for r, panel in enumerate(column):
            ax = axes[r][c]
            seen: dict[str, int] = {}
            for line in panel.curves:
                if line.group not in groups:
                    groups.append(line.group)
                colour = f"C{groups.index(line.group) % 10}"
                style = STYLES[seen.get(line.group, 0) % len(STYLES)]
                seen[line.group] = seen.get(line.group, 0) + 1
                ax.plot(line.lambdas, line.mean, style, marker=".", color=colour, label=line.label)
                if line.se is not None:
                    ax.fill_between(line.lambdas, line.mean - line.se, line.mean + line.se, color=colour, alpha=0.2)
            ax.set_title(panel.title, fontsize=10)
            ax.set_ylabel(panel.ylabel)
            ax.set_xlabel(LAMBDA_LABEL)
            ax.grid(alpha=0.3)
            if r == 0:  # one legend per column is enough: the rows share the lines
                ax.legend(fontsize=7, handlelength=4)  # long enough to show a dashed line as dashed
        for r in range(len(column), n_rows):
            axes[r][c].axis("off")
    if title:
        fig.suptitle(title)
    return save(fig, path)
