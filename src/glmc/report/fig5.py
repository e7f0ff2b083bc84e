"""Paper 001 Fig. 5 (§6): eigen-angles of weight matching's residual map O_wm (spread over [0, pi]) and of
learned matching's correction O_learned O_wm^T (near 0), pooled over the pairs of the Table 2 digits run."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from glmc.eval.bands import save
from glmc.report.artefact import Artefact
from glmc.report.results import run_results
from glmc.report.section import write_section
from glmc.report.table2 import DIGITS_STEP
from glmc.report.tables import markdown, number, write_csv

SMALL_DEGREES = 10  # "near 0"
# (method in results.json, diagnostics key, panel title)
PANELS = (
    ("weight", "residual_angles", "weight matching: O_wm"),
    ("learned", "correction_angles", "learned correction: O_learned O_wm^T"),
)


def pooled_angles(results: dict, method: str, key: str) -> tuple[np.ndarray, int]:
    """Every pair's angles from `method`'s diagnostics `key`, pooled; and the number of pairs."""
    if method not in results["methods"]:
        raise KeyError(f"results.json has no method {method!r} (it has {list(results['methods'])})")
    pairs = results["methods"][method]["pairs"]
    missing = [p["seeds"] for p in pairs if key not in (p.get("diagnostics") or {})]
    if missing:
        raise KeyError(
            f"{method}: pairs {missing} have no diagnostics {key!r} (it needs an orthogonal residual map, and "
            "for the correction learned matching started from weight matching)"
        )
    return np.concatenate([np.asarray(p["diagnostics"][key], dtype=float) for p in pairs]), len(pairs)


def make(root: Path, out: Path) -> list[Path]:
    out = Path(out)
    results = run_results(Path(root) / DIGITS_STEP.label)
    fig, axes = plt.subplots(1, len(PANELS), figsize=(4.3 * len(PANELS), 3.3), sharex=True)
    bins = np.linspace(0, math.pi, 37)  # 5-degree bins
    rows, csv_rows = [], []
    for ax, (method, key, title), colour in zip(axes, PANELS, ("tab:blue", "tab:orange")):
        angles, n_pairs = pooled_angles(results, method, key)
        ax.hist(angles, bins=bins, density=True, color=colour)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("eigen-angle (rad)")
        ax.set_xticks([0, math.pi / 4, math.pi / 2, 3 * math.pi / 4, math.pi], ["0", "π/4", "π/2", "3π/4", "π"])
        median = float(np.degrees(np.median(angles)))
        small = float(np.mean(angles < math.radians(SMALL_DEGREES)))
        rows.append([method, key, str(n_pairs), str(angles.size), number(median, 1), number(100 * small, 1)])
        csv_rows.append([method, key, n_pairs, angles.size, median, small])
    axes[0].set_ylabel("density")
    fig.suptitle(f"{results['model']} on {results['dataset']}: residual-map eigen-angles, pairs pooled", fontsize=10)
    figure = save(fig, out / "fig5.png")
    csv = write_csv(
        out / "fig5.csv",
        ["method", "angles_of", "pairs", "angles", "median_degrees", "share_below_10_degrees"],
        csv_rows,
    )
    table = markdown(
        ["method", "angles of", "pairs", "angles", "median angle (°)", f"share below {SMALL_DEGREES}° (%)"], rows
    )
    body = (
        "![Fig. 5: eigen-angles of the residual map, weight matching and learned correction](fig5.png)\n\n"
        f"{table}\n\n"
        "Angles |arg z| in [0, π] of the eigenvalues z of the orthogonal residual map, every seed pair's "
        "pooled (a rotation by t in a plane gives t twice). The correction is that of the trained latents, "
        "also for a pair where learned matching returned its start (`kept_start`). Files: [fig5.csv](fig5.csv)."
    )
    return [figure, csv, write_section(ARTEFACT, out, body)]


ARTEFACT = Artefact(
    "fig5", "Fig. 5: eigen-angles of weight matching's residual map and of the learned correction", (DIGITS_STEP,), make
)
