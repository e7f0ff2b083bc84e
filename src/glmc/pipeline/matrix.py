"""N x N barrier matrices of a run of three or more endpoints: with `pairing=all`, per method, each pair's
barrier after aligning the later endpoint (B) to the earlier (A); with `pairing=universe`, per multi-model
method, the barrier between the universe-aligned models (glmc.pipeline.multi).

Only the pairs i < j are measured; cell (j, i) mirrors cell (i, j), so the matrix is symmetric by
construction, and the diagonal is 0 (a model's path to itself is flat). results.json's `matrix` holds each
matrix with the mean ± standard error of its off-diagonal barriers; the files are matrix_<method>.csv (or
matrix_universe_<method>.csv) and matrix.png, one heatmap per method."""

from __future__ import annotations

import csv
import itertools
import math
from pathlib import Path
from typing import Any

import numpy as np

from glmc.config import Config
from glmc.eval.barrier_heatmaps import plot_barrier_matrices
from glmc.pipeline.endpoint_record import Endpoint
from glmc.safe_files import atomic_path


def barrier_matrix(n: int, barriers: dict[tuple[int, int], float]) -> list[list[float]]:
    """The symmetric n x n matrix of the pairs' barriers ((i, j) with i < j), zero on the diagonal."""
    grid = [[0.0] * n for _ in range(n)]
    for i, j in itertools.combinations(range(n), 2):
        if (i, j) not in barriers:
            raise ValueError(f"no barrier for the pair ({i}, {j}) of {n} endpoints: a matrix needs every pair")
        grid[i][j] = grid[j][i] = float(barriers[(i, j)])
    return grid


def matrix_record(labels: list[str], barriers: dict[tuple[int, int], float]) -> dict[str, Any]:
    """A matrix with its labels, and the mean and standard error of the barriers of its pairs."""
    values = np.array([barriers[p] for p in itertools.combinations(range(len(labels)), 2)], dtype=float)
    se = float(values.std(ddof=1) / math.sqrt(len(values))) if len(values) > 1 else None
    return {
        "labels": labels,
        "barriers": barrier_matrix(len(labels), barriers),
        "mean": float(values.mean()),
        "se": se,
        "pairs": len(values),
    }


def barrier_matrices(
    cfg: Config,
    endpoints: list[Endpoint],
    pairs: list[tuple[int, int]],
    methods: dict[str, Any],
    multi: dict[str, Any] | None,
) -> dict[str, dict[str, Any]]:
    """results["matrix"]: {"pairwise": method -> matrix} for pairing=all, {"universe": method -> matrix}
    for pairing=universe; empty below three endpoints or for another pairing."""
    labels = [e.label for e in endpoints]
    if len(endpoints) < 3:
        return {}
    out: dict[str, dict[str, Any]] = {}
    if str(cfg.pairing) == "all":
        out["pairwise"] = {
            name: matrix_record(labels, {pair: p["barrier"] for pair, p in zip(pairs, summary["pairs"])})
            for name, summary in methods.items()
        }
    if multi:  # run_multi measures the pairs i < j in this order
        every = list(itertools.combinations(range(len(endpoints)), 2))
        out["universe"] = {
            name: matrix_record(labels, dict(zip(every, m["pairwise_barriers"].values()))) for name, m in multi.items()
        }
    return out


def write_matrix_csv(path: Path, labels: list[str], grid: list[list[float]]) -> Path:
    """A square table: a header of the labels, then one row per label."""
    with atomic_path(Path(path)) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["endpoint", *labels])
        writer.writerows([label, *map(repr, row)] for label, row in zip(labels, grid))
    return Path(path)


def read_matrix_csv(path: Path) -> tuple[list[str], list[list[float]]]:
    """What write_matrix_csv wrote: (labels, matrix)."""
    with open(path, newline="") as f:
        header, *rows = list(csv.reader(f))
    return header[1:], [[float(v) for v in row[1:]] for row in rows]


def write_matrices(matrices: dict[str, dict[str, Any]], run_dir: Path, title: str) -> list[Path]:
    """matrix_<method>.csv per pairwise method, matrix_universe_<method>.csv per universe method, and
    matrix.png with every one of them as a heatmap."""
    files, panels = [], {}
    for kind, by_method in matrices.items():
        for name, m in by_method.items():
            stem = name if kind == "pairwise" else f"universe_{name}"
            files.append(write_matrix_csv(run_dir / f"matrix_{stem}.csv", m["labels"], m["barriers"]))
            spread = "" if m["se"] is None else f" ± {m['se']:.3f}"
            panels[f"{stem}: {m['mean']:.3f}{spread}"] = (m["labels"], m["barriers"])
    if panels:
        files.append(plot_barrier_matrices(run_dir / "matrix.png", panels, title=title))
    return files
