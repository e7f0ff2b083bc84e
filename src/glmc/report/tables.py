"""One table, three formats: Markdown for section.md, LaTeX for the paper, CSV for anything else; cells are
plain text with `±`, which LaTeX gets as math (and underscores escaped)."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from pathlib import Path

from glmc.safe_files import atomic_write_text


def number(value: float | None, digits: int = 3) -> str:
    """A value for a table cell; "—" where there is none (a ratio to a zero baseline, a missing se)."""
    if value is None or not math.isfinite(value):
        return "—"
    return f"{value:.{digits}f}"


def seconds(value: float | None) -> str:
    """Seconds as a table shows them: two significant digits below ten, whole seconds above."""
    if value is None or not math.isfinite(value):
        return "—"
    if value < 0.01:  # data-free methods: a few milliseconds, not worth digits
        return "0" if value == 0 else "<0.01"
    return f"{value:.2g}" if value < 10 else f"{value:.0f}"


def mean_pm(mean: float, se: float | None, digits: int = 3) -> str:
    return number(mean, digits) + ("" if se is None else f" ± {number(se, digits)}")


def ratio(value: float, base: float | None) -> float | None:
    return value / base if base else None


def markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _tex(cell: str) -> str:
    cell = str(cell).replace("\\", r"\textbackslash{}")
    for char in "_%&#$":
        cell = cell.replace(char, "\\" + char)
    return cell.replace("±", r"$\pm$").replace("×", r"$\times$").replace("—", "--")


def latex(header: Sequence[str], rows: Sequence[Sequence[str]], caption: str = "") -> str:
    """A self-contained tabular (no packages needed), first column left-aligned, the rest right."""
    spec = "l" + "r" * (len(header) - 1)
    lines = [f"% {caption}"] if caption else []
    lines += [f"\\begin{{tabular}}{{{spec}}}", r"\hline", " & ".join(_tex(h) for h in header) + r" \\", r"\hline"]
    lines += [" & ".join(_tex(c) for c in row) + r" \\" for row in rows]
    lines += [r"\hline", r"\end{tabular}"]
    return "\n".join(lines)


def write_csv(path: Path, header: Sequence[str], rows: Sequence[Sequence[object]]) -> Path:
    """Raw numbers (no ± formatting), empty cells for missing values."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows([["" if v is None else v for v in row] for row in rows])
    return atomic_write_text(path, buffer.getvalue())
