"""Curves between aligned models (Garipov et al. 2018; glmc.curves): an untrained curve is the straight
line, its ends are the models, training lowers the loss along it, and the pipeline writes, caches and
resumes its record (curve=bezier|chain)."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import glmc
from glmc.curves.curve import Curve, CurveSettings, node_weights
from glmc.eval.evaluator import Evaluator
from glmc.pipeline.run import run_pipeline

from conftest import compose_config
from tiny_hf import tiny_vit

LAMBDAS = [0.0, 0.2, 0.5, 0.7, 1.0]


def untrained(alignment, kind="bezier", bends=1):
    return Curve(alignment.reference, alignment.model, CurveSettings(kind, bends), "classification", alignment.circuits)


TRAINER = {"accelerator": "cpu", "enable_progress_bar": False}


@pytest.fixture(scope="module")
def aligned():
    """A weight-matched tiny ViT pair (heads interpolated as circuits) and training batches."""
    a, b = tiny_vit(seed=0, hidden=16, heads=2, mlp=32), tiny_vit(seed=1, hidden=16, heads=2, mlp=32)
    g = torch.Generator().manual_seed(0)
    inputs, labels = torch.randn(64, 1, 8, 8, generator=g), torch.randint(0, 10, (64,), generator=g)
    data = DataLoader(TensorDataset(inputs, labels), batch_size=32)
    return glmc.align(a, b, "weight"), data


@pytest.mark.parametrize(("kind", "bends"), [("bezier", 1), ("bezier", 2), ("chain", 1), ("chain", 3)])
def test_an_untrained_curve_is_the_straight_line_and_ends_at_the_models(aligned, kind, bends):
    alignment, data = aligned
    assert alignment.circuits == ("qk", "vo")  # bends are points of circuit space
    curve = untrained(alignment, kind, bends)
    evaluator = Evaluator(list(data), "classification", progress=False)
    along, straight = curve.path(evaluator, LAMBDAS)["loss"], evaluator.path(alignment, LAMBDAS)["loss"]
    assert along == pytest.approx(straight, rel=1e-6, abs=0)
    assert along[0] == straight[0] and along[-1] == straight[-1]  # the ends' own tensors
    for lam, end in ((1.0, alignment.reference), (0.0, alignment.model)):
        point = curve.params_at(lam)
        assert all(torch.equal(point[k], v) for k, v in end.params().items())
    assert sum(node_weights(kind, bends, 0.3)) == pytest.approx(1.0)


def test_a_bend_off_the_line_changes_only_the_inside(aligned):
    alignment, data = aligned
    curve = untrained(alignment, "chain")
    with torch.no_grad():
        for p in curve.bends.parameters():
            p.mul_(1.5)
    evaluator = Evaluator(list(data), "classification", progress=False)
    along, straight = curve.path(evaluator, LAMBDAS)["loss"], evaluator.path(alignment, LAMBDAS)["loss"]
    assert along[0] == straight[0] and along[-1] == straight[-1]
    assert abs(along[2] - straight[2]) > 1e-3


def test_training_lowers_the_loss_along_the_curve(aligned, tmp_path):
    alignment, data = aligned
    batches = list(data)

    def mid_loss(curve):
        with torch.no_grad():
            return sum(float(curve.loss(x, y, 0.5)) for x, y in batches) / len(batches)

    start = untrained(alignment)
    curve = glmc.fit_curve(alignment, data, "bezier", max_steps=12, lr=0.05, run_dir=tmp_path, trainer=TRAINER)
    assert curve.diagnostics["steps"] == 12 and curve.diagnostics["resumed_from"] is None
    assert mid_loss(curve) < mid_loss(start) - 0.02
    # ends fixed: the trained curve still starts and ends at the models
    assert all(torch.equal(curve.params_at(1.0)[k], v) for k, v in alignment.reference.params().items())
    again = glmc.fit_curve(alignment, data, "bezier", max_steps=12, lr=0.05, run_dir=tmp_path, trainer=TRAINER)
    assert again.diagnostics["resumed_from"] is not None  # the finished bends reused
    assert mid_loss(again) == mid_loss(curve)


def test_bad_settings_name_their_key(aligned):
    alignment, data = aligned
    with pytest.raises(ValueError, match="curve.kind"):
        CurveSettings(kind="spline")
    with pytest.raises(ValueError, match="fit_curve.bends"):
        glmc.fit_curve(alignment, data, "chain", bends=0)
    with pytest.raises(TypeError, match="Alignment or a pair"):
        glmc.fit_curve(alignment.model, data)


def test_the_pipeline_writes_the_curve_record_and_a_rerun_reuses_its_bends(tmp_path):
    overrides = ["debug=fast", f"cache_dir={tmp_path / 'endpoints'}", "logger=none", "matcher.methods=[vanilla,weight]"]
    curve = ["curve=chain", "curve.max_steps=2", "curve.batches_per_eval=1", "merge.export=true"]
    cfg = compose_config(*overrides, *curve)
    results = run_pipeline(cfg, tmp_path / "run")
    for method in ("vanilla", "weight"):
        pair = results["methods"][method]["pairs"][0]
        record = pair["curve"]
        assert record["kind"] == "chain" and record["steps"] == 2 and record["resumed_from"] is None
        assert record["lambdas"] == pair["lambdas"] and len(record["test_loss"]) == len(pair["lambdas"])
        assert record["barrier"] >= 0 and record["linear_barrier"] >= 0
        assert (tmp_path / "run" / method / "curve_0-1.png").exists()
        # the curve's ends are the path's (vanilla: through the canonical forms of the same models)
        assert record["linear_loss"][-1] == pytest.approx(record["test_loss"][-1], rel=1e-6)
        assert record["export"]["exported"] or "curve's midpoint" in record["export"]["reason"]
    first = results["methods"]["weight"]["pairs"][0]["curve"]
    written = json.loads((tmp_path / "run" / "results.json").read_text())
    assert written["methods"]["weight"]["pairs"][0]["curve"]["barrier"] == first["barrier"]
    again = run_pipeline(cfg, tmp_path / "run")["methods"]["weight"]["pairs"][0]["curve"]
    assert again["resumed_from"] == first["checkpoint"] and again["test_loss"] == first["test_loss"]
