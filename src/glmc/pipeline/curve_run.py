"""curve=bezier|chain in the pipeline: per method and pair, a curve between A and the aligned B trained on
the training split (glmc.curves), evaluated at the path's lambdas beside the straight line between the same
ends on the same batches (vanilla's: between the canonical forms of A and B, not the original parameters'
line); its record goes into the pair's entry of results.json under "curve", its figure
into the method's folder (curve_<pair>.png)."""

from __future__ import annotations

import itertools
import logging
from pathlib import Path
from typing import Any

from glmc.alignment import Alignment
from glmc.curves.curve import CurveSettings
from glmc.curves.fit import train_curve
from glmc.eval.barrier import barrier
from glmc.eval.evaluator import Evaluator
from glmc.models.canonical import CanonicalTransformer
from glmc.pipeline.hf_folders import evaluation_config
from glmc.pipeline.merges import export_midpoint
from glmc.pipeline.model_card import model_card

log = logging.getLogger(__name__)


def curve_settings(cfg: Any) -> CurveSettings:
    """The run's curve group as the curve's settings (errors name curve.<key>)."""
    c = cfg.curve
    return CurveSettings(kind=str(c.name), bends=int(c.bends), max_steps=int(c.max_steps), lr=float(c.lr))


def curve_evaluator(run: Any, batches: int) -> Evaluator:
    """The path's evaluator, or one over its first `batches` batches (curve.batches_per_eval > 0)."""
    if batches == 0:
        return run.evaluator
    ev = run.evaluator
    kept = list(itertools.islice(ev.batches(), batches))
    return Evaluator(kept, ev.task, ev.device, ev.precision, progress=False)


def curve_record(run: Any, name: str, label: str, alignment: Alignment, pair: tuple, context: Any) -> dict[str, Any]:
    """The trained curve of method `name` for the pair `label`: its losses at run.lambdas, its barrier and
    the straight line's on the same batches, its training's steps and seconds (every attempt's)."""
    settings, circuits = curve_settings(run.cfg), tuple(alignment.circuits)
    if isinstance(alignment.reference, CanonicalTransformer):
        a, b = alignment.reference, alignment.model
    else:  # vanilla: the original models, through the canonical forms of the same functions
        a, b = pair[0].canonical, pair[1].canonical
    shape = f"{settings.kind} curve ({settings.bends} bends, {settings.max_steps} steps)"
    log.info("%s %s: training a %s", name, label, shape)
    curve, info = train_curve(a, b, context, settings, circuits, str(run.cfg.data.task), f"{name}_curve")
    evaluator = curve_evaluator(run, int(run.cfg.curve.batches_per_eval))
    lambdas = list(run.lambdas)
    along = curve.path(evaluator, lambdas)
    straight = evaluator.path(Alignment(a, b, circuits=circuits), lambdas, desc=f"{name} {label} straight line")
    record = {
        "kind": settings.kind,
        "bends": settings.bends,
        "lambdas": lambdas,
        "test_loss": along["loss"],
        "test_accuracy": along["accuracy"] if run.cfg.data.task == "classification" else [None] * len(lambdas),
        "barrier": barrier(lambdas, along["loss"]),
        "linear_loss": straight["loss"],
        "linear_barrier": barrier(lambdas, straight["loss"]),
        "batches_per_eval": int(run.cfg.curve.batches_per_eval),
        **{k: v for k, v in info.items() if k not in ("train_lambda",)},
    }
    log.info("%s %s: curve barrier %.4f (straight line %.4f)", name, label, record["barrier"], record["linear_barrier"])
    folder = Path(run.run_dir) / name
    figure = plot_curve(record, folder / f"curve_{label}.png", f"{name} {label}: {settings.kind} curve")
    record["figure"] = str(figure)
    lines = {"curve": along["loss"], "linear": straight["loss"]}
    run.tracker.log_lines(f"curve/{name}_{label}", lambdas, lines, "lambda")
    run.tracker.log_image(f"curve/{name}_{label}_figure", figure)
    first = pair[0] is run.endpoints[0] and pair[1] is run.endpoints[1]  # merge.export writes the first pair's
    if run.cfg.merge.export and first:
        record["export"] = export_curve_midpoint(run, curve, circuits, pair, folder / f"hf_curve_{label}", name, record)
    return record


def export_curve_midpoint(
    run: Any, curve: Any, circuits: tuple, pair: tuple, folder: Path, name: str, record: dict[str, Any]
) -> dict[str, Any]:
    """The curve's midpoint (lam = 0.5) as a Hugging Face folder, as merge.export writes the path's."""
    mid = curve.point(0.5)
    inputs = next(iter(run.data.test_dataloader()))[0][:8]
    source = evaluation_config(run.cfg).data.tokenizer_path
    # the midpoint as both ends of an alignment: its own interpolation at 0.5 is itself, exactly
    as_path = Alignment(mid, mid, circuits=circuits)
    card = model_card(run.cfg, name, pair, record, what=f"the trained {run.cfg.curve.name} curve's midpoint")
    shard = run.cfg.merge.export_max_shard
    a = pair[0]
    out = export_midpoint(as_path, a.model, folder, inputs, run.data.tokenizer, source, a.dtype, card, shard)
    if not out["exported"]:  # the bends train freely: a LayerNorm model's stream may leave the mean-zero plane
        out["reason"] = f"the curve's midpoint, its bends trained freely: {out['reason']}"
    return out


def plot_curve(record: dict[str, Any], path: Path, title: str) -> Path:
    """The curve's loss against lambda beside the straight line's, as barrier.png draws paths."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(5, 4))
    lam = record["lambdas"]
    ax.plot(lam, record["linear_loss"], marker=".", label=f"straight line (barrier {record['linear_barrier']:.3f})")
    ax.plot(lam, record["test_loss"], marker=".", label=f"{record['kind']} curve (barrier {record['barrier']:.3f})")
    ax.set_xlabel("λ   (1: A, 0: aligned B)")
    ax.set_ylabel("test loss (nats)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.subplots_adjust(left=0.14, right=0.97, bottom=0.13, top=0.9)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
