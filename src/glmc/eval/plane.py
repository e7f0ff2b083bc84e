"""The loss over the plane through three models (Garipov et al. 2018, Li et al. 2018): an orthonormal basis
(u, v) of the plane through w0, w1, w2 by Gram-Schmidt on w1 - w0 and w2 - w0 over all their tensors, each
model's 2-D coordinates, and the loss and accuracy at every point of a lattice over their bounding box.

A point theta = w0 + x u + y v is built as the same point's barycentric combination
(1 - a - b) w0 + a w1 + b w2, one fused sum over the three models' tensors (interpolation.weighted_sum), so
u and v are never held and each model's own coordinates give its tensors bit for bit. Every point reuses the
evaluator's batches (kept on the device after the first pass) and the three models' tensors, moved once.
The plane is in weight space: a method whose path interpolates circuits (qk, vo) follows a curve there."""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from glmc.eval.evaluator import LAYERWISE_POINTS_FROM, Evaluator, Functional, logits_of
from glmc.eval.path_point import MergedParams, interpolated_forward
from glmc.host_memory import tensor_bytes
from glmc.interpolation import check_same_layout, interpolate_state_dicts, merge_configs, merge_params
from glmc.models.canonical import canonical_forward
from glmc.models.families import family_named

log = logging.getLogger(__name__)
COLLINEAR = 1e-6  # the third model's distance off the line through the first two, relative: below it, no plane


def _floating(params: dict[str, Tensor]) -> list[str]:
    return [name for name, t in params.items() if torch.is_floating_point(t)]


@dataclass
class Plane:
    """The plane through three models' tensors: their coordinates (w0 at the origin, w1 on the x axis)."""

    params: Sequence[dict[str, Tensor]]
    coords: list[tuple[float, float]]

    def weights(self, x: float, y: float) -> list[float]:
        """The barycentric weights (of w0, w1, w2) of the point (x, y): exactly a one-hot at each model's
        own coordinates."""
        (x1, _), (x2, y2) = self.coords[1], self.coords[2]
        b = y / y2
        a = (x - b * x2) / x1
        return [1.0 - a - b, a, b]

    @torch.no_grad()
    def basis(self) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """u and v, the orthonormal basis (float32 tensors by name, the floating ones only)."""
        (x1, _), (x2, y2) = self.coords[1], self.coords[2]
        w0, w1, w2 = self.params
        u = {n: (w1[n].double() - w0[n].double()) / x1 for n in _floating(w0)}
        v = {n: (w2[n].double() - w0[n].double() - x2 * u[n]) / y2 for n in u}
        return {n: t.float() for n, t in u.items()}, {n: t.float() for n, t in v.items()}

    @torch.no_grad()
    def point(self, x: float, y: float) -> dict[str, Tensor]:
        """The tensors of the model at (x, y)."""
        return interpolate_state_dicts(self.params, self.weights(x, y))


@torch.no_grad()
def plane_through(params: Sequence[dict[str, Tensor]]) -> Plane:
    """The plane through three models' tensors (one layout; integer tensors are not coordinates). Inner
    products are summed in float64, a tensor at a time. ValueError where two coincide or all three lie on
    one line (an aligned B that is B itself)."""
    if len(params) != 3:
        raise ValueError(f"a plane passes through three models, not {len(params)}")
    check_same_layout(params, [1.0, 1.0, 1.0])
    dots = torch.zeros(3, dtype=torch.float64)  # <d1, d1>, <d1, d2>, <d2, d2>
    for name in _floating(params[0]):
        d1 = (params[1][name].double() - params[0][name].double()).flatten()
        d2 = (params[2][name].double() - params[0][name].double()).flatten()
        dots += torch.stack([d1 @ d1, d1 @ d2, d2 @ d2]).cpu()
    d11, d12, d22 = dots.tolist()
    if d11 == 0.0:
        raise ValueError("models 0 and 1 are the same tensors: no plane passes through them")
    x1 = math.sqrt(d11)
    x2 = d12 / x1
    y2 = math.sqrt(max(d22 - x2 * x2, 0.0))
    if y2 <= COLLINEAR * max(x1, math.sqrt(d22)):
        raise ValueError("the three models lie on one line (one of them is another, or between them): no plane")
    return Plane(params, [(0.0, 0.0), (x1, 0.0), (x2, y2)])


def lattice(coords: Sequence[tuple[float, float]], grid: int, margin: float) -> tuple[list[float], list[float]]:
    """x and y of a grid x grid lattice over the coordinates' bounding box, widened by `margin` of its size on
    each side."""
    if int(grid) < 2:
        raise ValueError(f"eval.plane.grid={grid}: a lattice needs at least 2 points a side")
    if not margin >= 0:
        raise ValueError(f"eval.plane.margin={margin}: must be a non-negative fraction of the box's size")
    xs, ys = zip(*coords)
    axes = []
    for values in (xs, ys):
        low, high = min(values), max(values)
        pad = margin * (high - low)
        axes.append(np.linspace(low - pad, high + pad, int(grid)).tolist())
    return axes[0], axes[1]


class PlaneEvaluator:
    """The loss and accuracy at points of one plane, with `evaluator`'s batches and device: the three models'
    tensors are moved there once; a large model's points are built a layer at a time (as the path's are)."""

    def __init__(self, evaluator: Evaluator, models: Sequence[torch.nn.Module]):
        ends = [Functional(m, evaluator.device) for m in models]
        if len({f.canonical for f in ends}) != 1:
            raise TypeError("the three models of a plane must all be canonical or all be the original models")
        self.evaluator, self.ends = evaluator, ends
        self.plane = plane_through([f.tensors for f in ends])
        self.layerwise = tensor_bytes(ends[0].tensors.values()) >= LAYERWISE_POINTS_FROM

    def at(self, x: float, y: float) -> tuple[float, float]:
        """Loss and accuracy of the model at (x, y)."""
        return self._metrics(self.plane.weights(x, y))

    def _metrics(self, weights: list[float]) -> tuple[float, float]:
        ev, first, tensors = self.evaluator, self.ends[0], [f.tensors for f in self.ends]
        if first.canonical:
            config = merge_configs([f.config for f in self.ends], weights)
            if config.norm_eps <= 0:  # a weighted sum of differing epsilons outside the triangle
                config = dataclasses.replace(config, norm_eps=min(f.config.norm_eps for f in self.ends))
            if self.layerwise:
                merged, family = MergedParams(tensors, weights), family_named(config.family)
                return ev._metrics(
                    lambda x: canonical_forward(config, merged, x, head=False),
                    lambda state: family.head(config, merged, state, lambda name, t: None),
                )
            with torch.inference_mode():
                params = merge_params(tensors, weights)
            return ev._metrics(lambda x: first.forward(params, x, config=config))
        if self.layerwise:
            with interpolated_forward(first.module, tensors, weights) as model:
                return ev._metrics(lambda x: logits_of(model(x, **first.options), model))
        with torch.inference_mode():
            params = interpolate_state_dicts(tensors, weights)
        return ev._metrics(lambda x: first.forward(params, x))

    def grid(self, grid: int, margin: float, desc: str = "plane") -> dict[str, Any]:
        """The three models' own points (timed, the first: the cost is logged from it) and then the lattice's,
        as a plain record: coordinates, loss and accuracy by [row y][column x]."""
        xs, ys = lattice(self.plane.coords, grid, margin)
        own = [self._metrics([1.0, 0.0, 0.0])]  # the first pass moves the batches to the device
        start = time.perf_counter()
        own.append(self._metrics([0.0, 1.0, 0.0]))  # timed with the batches in place: one evaluation's cost
        seconds = time.perf_counter() - start
        total = len(xs) * len(ys) + 1
        log.info("%s: %d points, about %.3g s (%.3g s a point)", desc, total, seconds * total, seconds)
        own.append(self._metrics([0.0, 0.0, 1.0]))
        cells = _each(
            [(x, y) for y in ys for x in xs], lambda p: self.at(*p), desc, not self.evaluator.progress, len(xs)
        )
        return {
            "coords": [list(c) for c in self.plane.coords],
            "model_loss": [m[0] for m in own],
            "model_accuracy": [m[1] for m in own],
            "x": xs,
            "y": ys,
            "loss": [[c[0] for c in row] for row in cells],
            "accuracy": [[c[1] for c in row] for row in cells],
            "grid": int(grid),
            "margin": float(margin),
        }


def _each(points: list, score: Callable, desc: str, quiet: bool, width: int) -> list[list[tuple[float, float]]]:
    """score(point) for every point, with a progress bar, in rows of `width`."""
    values = [score(p) for p in tqdm(points, desc=desc, disable=quiet, leave=False)]
    return [values[i : i + width] for i in range(0, len(values), width)]


def evaluate_plane(
    models: Sequence[torch.nn.Module],
    loader: Any,
    grid: int = 11,
    margin: float = 0.2,
    task: str = "classification",
    progress: bool = True,
    **options,
) -> dict[str, Any]:
    """The loss and accuracy over the plane through three models (canonical factored, or original models of
    one architecture) on a grid x grid lattice (options: device, precision, cache_mb)."""
    models = list(models)
    evaluator = Evaluator(loader, task, progress=progress, **options)
    return PlaneEvaluator(evaluator, models).grid(grid, margin)
