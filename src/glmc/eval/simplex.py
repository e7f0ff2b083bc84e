"""The multi-model barrier (paper 001 Eq. 2) over the simplex of N models: the largest excess loss
L(sum_i a_i theta_i) - sum_i a_i L(theta_i) over points a (a_i >= 0, sum_i a_i = 1)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from glmc.alignment import Alignment
from glmc.eval.barrier import barrier
from glmc.interpolation import interpolate

Point = tuple[float, ...]


def _as_point(coords: Sequence[Fraction | float]) -> Point:
    """The nearest floats, one coordinate moved by a few ulps where needed to sum exactly to 1."""
    values = [float(c) for c in coords]
    total = sum(values)
    if total == 1.0:
        return tuple(values)
    direction = -math.inf if total > 1.0 else math.inf
    for k in sorted(range(len(values)), key=lambda i: -values[i]):
        trial = list(values)
        for _ in range(4):
            trial[k] = math.nextafter(trial[k], direction)
            if sum(trial) == 1.0:
                return tuple(trial)
    return tuple(values)


def _grid(n_models: int, divisions: int) -> list[Point]:
    """Every point whose coordinates are multiples of 1/divisions, in lexicographic order."""
    points = []
    for head in itertools.product(range(divisions + 1), repeat=n_models - 1):
        rest = divisions - sum(head)
        if rest >= 0:
            points.append(_as_point([Fraction(k, divisions) for k in (*head, rest)]))
    return points


def simplex_points(n_models: int, step: float = 0.1, samples: int = 32, seed: int = 0) -> list[Point]:
    """Points of the simplex of `n_models` models: up to three, the barycentric grid of spacing `step`
    (1 / step an integer); more, the vertices, edge midpoints, centroid and `samples` Dirichlet(1) draws."""
    if n_models < 1:
        raise ValueError(f"n_models={n_models}: at least one model")
    if n_models <= 3:
        divisions = round(1.0 / step)
        if divisions < 1 or abs(divisions * step - 1.0) > 1e-9:
            raise ValueError(f"step={step}: 1 / step must be a positive integer")
        return _grid(n_models, divisions)
    eye = np.eye(n_models)
    points = [_as_point(v) for v in eye]
    points += [_as_point(0.5 * (eye[i] + eye[j])) for i, j in itertools.combinations(range(n_models), 2)]
    points.append(_as_point([Fraction(1, n_models)] * n_models))
    rng = np.random.default_rng(seed)
    points += [_as_point(p) for p in rng.dirichlet(np.ones(n_models), size=samples)]
    return points


def excess_losses(
    points: Sequence[Sequence[float]], losses: Sequence[float], endpoint_losses: Sequence[float]
) -> np.ndarray:
    """L(sum_i a_i theta_i) - sum_i a_i L(theta_i) for every point a."""
    pts = np.asarray(points, float)
    ends = np.asarray(endpoint_losses, float)
    if pts.ndim != 2 or pts.shape[1] != len(ends) or len(pts) != len(losses):
        raise ValueError(f"{len(losses)} losses, points of shape {pts.shape} and {len(ends)} endpoint losses")
    return np.asarray(losses, float) - pts @ ends


def multi_barrier(
    points: Sequence[Sequence[float]], losses: Sequence[float], endpoint_losses: Sequence[float]
) -> tuple[float, Point]:
    """Paper 001 Eq. 2: the largest excess loss over the points, and the point where it is reached."""
    excess = excess_losses(points, losses, endpoint_losses)
    best = int(np.argmax(excess))
    return float(excess[best]), tuple(float(x) for x in points[best])


def _vertex(point: Sequence[float]) -> int | None:
    hot = [i for i, a in enumerate(point) if a != 0.0]
    return hot[0] if len(hot) == 1 and point[hot[0]] == 1.0 else None


def evaluate_simplex(
    evaluator: Any,
    models: Sequence[torch.nn.Module],
    points: Sequence[Sequence[float]],
    circuits: Sequence[str] = (),
    progress: bool = True,
) -> dict[str, Any]:
    """Loss and accuracy of sum_i a_i models[i] at every point a, and the multi-model barrier."""
    models = list(models)
    for p in points:
        if len(p) != len(models):
            raise ValueError(f"point {tuple(p)} has {len(p)} coordinates for {len(models)} models")
        if min(p) < 0 or abs(sum(p) - 1.0) > 1e-6:
            raise ValueError(f"point {tuple(p)} is not in the simplex")
    out: dict[str, Any] = {"points": [tuple(float(a) for a in p) for p in points], "test_loss": [], "test_accuracy": []}
    endpoint: dict[int, float] = {}
    for p in tqdm(out["points"], desc="simplex", disable=not progress, leave=False):
        loss, acc = evaluator.evaluate(interpolate(models, p, circuits=circuits))
        out["test_loss"].append(loss)
        out["test_accuracy"].append(acc)
        if (v := _vertex(p)) is not None:
            endpoint[v] = loss
    for i, m in enumerate(models):
        if i not in endpoint:
            endpoint[i] = evaluator.evaluate(m)[0]
    out["endpoint_loss"] = [endpoint[i] for i in range(len(models))]
    out["excess"] = excess_losses(out["points"], out["test_loss"], out["endpoint_loss"]).tolist()
    out["barrier"], out["argmax"] = multi_barrier(out["points"], out["test_loss"], out["endpoint_loss"])
    return out


def pairwise_barriers(
    evaluator: Any,
    aligned_models: Sequence[torch.nn.Module],
    circuits: Sequence[str],
    lambdas: Sequence[float],
) -> dict[tuple[int, int], float]:
    """Eq. 1 barrier between every pair (i, j), i < j, of models aligned to a common universe."""
    out = {}
    for i, j in itertools.combinations(range(len(aligned_models)), 2):
        alignment = Alignment(reference=aligned_models[i], model=aligned_models[j], circuits=tuple(circuits))
        curve = evaluator.path(alignment, lambdas, desc=f"pair {i}-{j}")
        out[(i, j)] = barrier(curve["lambdas"], curve["loss"])
    return out
