"""eval.plane in a run: per method and pair, the loss over the plane through A, B and aligned B
(models=aligned), or through the pair's endpoints and the next one (models=endpoints, once per pair), as a
record under the pair's "plane" key in results.json and a contour plot in the method's folder."""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from glmc.alignment import Alignment
from glmc.eval.plane import PlaneEvaluator
from glmc.eval.plane_plot import plot_plane
from glmc.models.canonical import CanonicalTransformer
from glmc.symmetry.embed_width import match_widths, same_shapes

log = logging.getLogger(__name__)
# models=endpoints: the pair's plane, by (run folder, pair, lattice), computed with the first method that asks
_ENDPOINT_PLANES: dict[tuple[str, str, int, float], dict[str, Any]] = {}


def _aligned_models(run: Any, alignment: Alignment, pair: tuple) -> tuple[list[torch.nn.Module] | None, str]:
    """(A, B in the method's parameterisation, aligned B), or None and why there is no such plane."""
    reference, aligned = alignment.reference, alignment.model
    if not isinstance(reference, CanonicalTransformer):
        return None, "the method interpolates the original models: its aligned B is B, on the line through A and B"
    if "factored" != reference.config.form or aligned.config.form != "factored":
        return None, "the method's models are not in the factored canonical form"
    b = pair[1].canonical
    if not same_shapes(reference, b):  # a narrower B, embedded as the pipeline embeds it before matching
        b = match_widths(reference, b, torch.Generator().manual_seed(pair[1].seed), str(run.cfg.embed_stream))
    return [reference, b, aligned], ""


def _third_endpoint(run: Any, pair: tuple) -> Any | None:
    """The endpoint after B in the run's order (wrapping round), neither A nor B; None with two endpoints."""
    ends = run.endpoints
    ia, ib = (next(i for i, e in enumerate(ends) if e is end) for end in pair)
    return next((ends[(ib + k) % len(ends)] for k in range(1, len(ends)) if (ib + k) % len(ends) != ia), None)


def plane_record(run: Any, name: str, label: str, alignment: Alignment, pair: tuple) -> dict[str, Any]:
    """The pair's plane record for method `name` (plain JSON): the lattice's losses and the models'
    coordinates, or {"skipped": why}."""
    settings = run.cfg.eval.plane
    if str(settings.models) == "endpoints":
        key = (str(run.run_dir), label, int(settings.grid), float(settings.margin))
        if key not in _ENDPOINT_PLANES:
            third = _third_endpoint(run, pair)
            if third is None:
                return {"skipped": "eval.plane.models=endpoints needs a third endpoint (e.g. seeds=[0,1,2])"}
            models, names = [e.model for e in (*pair, third)], [pair[0].label, pair[1].label, third.label]
            _ENDPOINT_PLANES[key] = _measure(run, name, label, models, names, ((0, 1), (0, 2), (1, 2)))
        return _ENDPOINT_PLANES[key]
    models, why = _aligned_models(run, alignment, pair)
    if models is None:
        log.info("plane %s %s skipped: %s", name, label, why)
        return {"skipped": why}
    record = _measure(run, name, label, models, ["A", "B", f"{name} B"], ((0, 1), (0, 2)))
    return {**record, "circuits": list(alignment.circuits)}  # a circuit path is not the plane's straight line


def _measure(run: Any, name: str, label: str, models: list, names: list[str], segments: tuple) -> dict[str, Any]:
    """The plane through `models` on the run's evaluator, its figure in the method's folder, logged to W&B."""
    settings, start = run.cfg.eval.plane, time.perf_counter()
    try:
        plane = PlaneEvaluator(run.evaluator, models)
    except ValueError as err:  # the three on one line (an aligned B that is B), or in different layouts
        log.info("plane %s %s skipped: %s", name, label, err)
        return {"skipped": str(err)}
    record = plane.grid(int(settings.grid), float(settings.margin), desc=f"plane {name} {label}")
    folder = run.run_dir / name
    folder.mkdir(parents=True, exist_ok=True)
    png = plot_plane(record, folder / f"plane_{label}.png", names, segments, f"{name} {label}: loss over the plane")
    run.tracker.log_image(f"plane/{name}/{label}", png)
    return {
        "models": names,
        "segments": [list(s) for s in segments],
        **record,
        "figure": str(png.relative_to(run.run_dir)),
        "seconds": time.perf_counter() - start,
    }
