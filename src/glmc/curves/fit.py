"""Fitting a curve's bends (glmc.curves.curve) through a matcher context's `fit` (Lightning, checkpoints and
resume, glmc.train.latent_fit), cached under the context's folder by a hash of the ends and the settings."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from glmc.matching.base import MatchContext, require_factored, settings_hash
from glmc.models.canonical import CanonicalTransformer

if TYPE_CHECKING:
    from glmc.curves.curve import Curve, CurveSettings


def train_curve(
    a: CanonicalTransformer,
    b: CanonicalTransformer,
    context: MatchContext,
    settings: CurveSettings,
    circuits: tuple[str, ...] = (),
    task: str | None = None,
    logger_name: str | None = None,
) -> tuple[Curve, dict[str, Any]]:
    """The trained curve between `a` and `b` (on the CPU) and what its training did. Checkpoints go to
    <context.run_dir>/curve_<kind>_<hash> (the hash covers the ends and the settings): a rerun resumes an
    interrupted fit there, or reuses a finished one."""
    from glmc.curves.curve import Curve

    require_factored(settings.where, a, b)
    key = settings_hash({**settings.hashed(), "circuits": list(circuits)}, a, b)
    folder = Path(context.run_dir) / f"curve_{settings.kind}_{key}"
    curve = Curve(a, b, settings, task or b.task, circuits)
    fit = context.require("fit", settings.where)
    logger = context.logger(logger_name or f"curve_{settings.kind}") if context.logger else False
    seconds, world_size, resume, earlier = fit(curve, context, folder, settings, logger)
    curve = curve.cpu()
    history = curve.history[~curve.history[:, 0].isnan()]
    return curve, {
        "steps": len(history),
        "seconds": seconds + earlier,  # every attempt's fit time, as an uninterrupted fit spends
        "world_size": world_size,
        "resumed_from": str(resume) if resume else None,
        "checkpoint": str(folder / "checkpoints" / "last.ckpt"),
        "train_loss": [float(x) for x in history[:, 0]],
        "train_lambda": [float(x) for x in history[:, 1]],
    }


def fit_curve(
    a: CanonicalTransformer,
    b: CanonicalTransformer,
    data: Any,
    settings: CurveSettings,
    circuits: tuple[str, ...] = (),
    run_dir: str | Path | None = None,
    make_trainer: Any = None,
    device: str | torch.device = "cpu",
) -> Curve:
    """The trained curve between canonical `a` and `b` on `data` (glmc.fit_curve checks its inputs first),
    with `.diagnostics` (train_curve's); checkpoints in `run_dir` (a temporary folder if None)."""
    from glmc.train.latent_fit import fit_latents

    with tempfile.TemporaryDirectory(prefix="glmc-curve-") as scratch:
        folder, where = Path(run_dir or scratch), torch.device(device)
        context = MatchContext(data=data, trainer=make_trainer, run_dir=folder, device=where, fit=fit_latents)
        curve, diagnostics = train_curve(a, b, context, settings, tuple(circuits))
    curve.diagnostics = diagnostics
    return curve
