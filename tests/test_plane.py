"""The plane through three models (glmc.eval.plane): an orthonormal basis that reconstructs them, each
model's own loss at its coordinates, lattice points equal to a model built from their tensors, clear
refusals, and eval.plane in a run (the record in results.json and the contour plot)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import glmc
from glmc.eval.evaluator import Evaluator
from glmc.eval.plane import PlaneEvaluator, lattice, plane_through
from glmc.models import to_canonical
from glmc.models.canonical import CanonicalTransformer
from glmc.pipeline.plane_run import plane_record
from glmc.pipeline.run import run_pipeline
from glmc.pipeline.validate import ConfigError, validate_config

from conftest import compose_config
from tiny_hf import tiny_gpt2, tiny_vit


def images(n=24, seed=0, batch=8):
    g = torch.Generator().manual_seed(seed)
    data = TensorDataset(torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g))
    return DataLoader(data, batch_size=batch)


def canonicals():
    return [to_canonical(tiny_vit(seed, layers=1)) for seed in (0, 1, 2)]


def flat(tensors: dict) -> torch.Tensor:
    return torch.cat([t.detach().double().flatten() for t in tensors.values()])


def test_the_basis_is_orthonormal_and_reconstructs_the_three_models():
    params = [m.params() for m in canonicals()]
    plane = plane_through(params)
    u, v = (flat(t) for t in plane.basis())
    assert u @ u == pytest.approx(1.0, abs=1e-6) and v @ v == pytest.approx(1.0, abs=1e-6)
    assert u @ v == pytest.approx(0.0, abs=1e-6)
    assert plane.coords[0] == (0.0, 0.0) and plane.coords[1][1] == 0.0 and plane.coords[2][1] > 0
    w0 = flat(params[0])
    for (x, y), own in zip(plane.coords, params):
        assert torch.allclose(w0 + x * u + y * v, flat(own), atol=1e-5)  # w0 + x u + y v
        point = plane.point(x, y)
        assert all(torch.equal(point[n], own[n]) for n in own)  # each model's own tensors, bit for bit


def test_two_models_or_a_line_make_no_plane():
    a, b, _ = (m.params() for m in canonicals())
    middle = {n: 0.5 * (a[n] + b[n]) for n in a}
    with pytest.raises(ValueError, match="one line"):
        plane_through([a, b, middle])
    with pytest.raises(ValueError, match="one line"):
        plane_through([a, b, b])  # vanilla's aligned B is B
    with pytest.raises(ValueError, match="same tensors"):
        plane_through([a, a, b])
    with pytest.raises(ValueError, match="three models"):
        plane_through([a, b])


def test_the_lattice_spans_the_widened_bounding_box():
    xs, ys = lattice([(0.0, 0.0), (4.0, 0.0), (1.0, 2.0)], grid=5, margin=0.25)
    assert xs == [-1.0, 0.5, 2.0, 3.5, 5.0] and ys == [-0.5, 0.25, 1.0, 1.75, 2.5]
    with pytest.raises(ValueError, match="eval.plane.grid"):
        lattice([(0.0, 0.0), (1.0, 0.0), (0.0, 1.0)], grid=1, margin=0.0)


def tokens(n=6, seed=0, batch=3):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 97, (n, 9), generator=g)
    return DataLoader(TensorDataset(ids, ids), batch_size=batch)


@pytest.mark.parametrize("form", ["canonical", "original", "text"])
def test_each_model_has_its_own_loss_at_its_coordinates(form):
    """ViTs in canonical form and as they are, and GPT-2s (the text track) in canonical form."""
    if form == "text":
        models, data = [to_canonical(tiny_gpt2(seed, layers=1)) for seed in (0, 1, 2)], tokens
    else:
        models = canonicals() if form == "canonical" else [tiny_vit(seed, layers=1) for seed in (0, 1, 2)]
        data = images
    task = models[0].task if form == "text" else "classification"
    record = glmc.evaluate_plane(models, data(), grid=3, margin=0.1, progress=False)
    evaluator = Evaluator(data(), task, progress=False)
    own = [evaluator.evaluate(m) for m in models]
    assert record["model_loss"] == pytest.approx([o[0] for o in own], rel=1e-6)
    assert record["model_accuracy"] == pytest.approx([o[1] for o in own], rel=1e-6)
    at = PlaneEvaluator(evaluator, models)
    for (x, y), (loss, _) in zip(record["coords"], own):
        assert at.at(x, y)[0] == pytest.approx(loss, rel=1e-6)
    assert len(record["loss"]) == len(record["y"]) == 3 and all(len(row) == 3 for row in record["loss"])
    assert all(math.isfinite(v) for row in record["loss"] for v in row)


def test_a_lattice_point_is_the_model_built_from_its_tensors():
    models = canonicals()
    record = glmc.evaluate_plane(models, images(), grid=3, margin=0.5, progress=False)
    plane = plane_through([m.params() for m in models])
    x, y = record["x"][0], record["y"][2]  # a corner outside the triangle: negative weights
    assert min(plane.weights(x, y)) < 0
    built = CanonicalTransformer(models[0].config, plane.point(x, y))
    assert record["loss"][2][0] == pytest.approx(Evaluator(images(), progress=False).evaluate(built)[0], rel=1e-5)


def test_the_api_names_what_is_wrong():
    models = canonicals()
    with pytest.raises(ValueError, match="three models"):
        glmc.evaluate_plane(models[:2], images())
    with pytest.raises(TypeError, match=r"models\[1\]"):
        glmc.evaluate_plane([models[0], "B", models[2]], images())


@pytest.mark.parametrize("key,value", [("grid", 1), ("margin", -1), ("models", "all")])
def test_bad_plane_settings_are_refused_naming_the_key(key, value):
    cfg = compose_config(f"eval.plane.{key}={value}")
    with pytest.raises(ConfigError, match=f"eval.plane.{key}"):
        validate_config(cfg)


def test_a_run_writes_each_methods_plane_and_its_figure(tmp_path, tiny_overrides):
    cfg = compose_config(
        *tiny_overrides, "seeds=[0,1]", "matcher=weight", "eval.plane.enabled=true", "eval.plane.grid=3"
    )
    run_pipeline(cfg, tmp_path / "run")
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    methods = saved["methods"]
    assert "on the line" in methods["vanilla"]["pairs"][0]["plane"]["skipped"]
    assert "one line" in methods["canonical"]["pairs"][0]["plane"]["skipped"]  # its aligned B is B
    plane = methods["weight"]["pairs"][0]["plane"]
    assert plane["models"] == ["A", "B", "weight B"] and plane["circuits"] == ["qk", "vo"]
    assert len(plane["loss"]) == 3 and len(plane["x"]) == 3 and len(plane["coords"]) == 3
    a_loss = saved["endpoints"][0]["test_loss"]
    assert plane["model_loss"][0] == pytest.approx(a_loss, rel=1e-5)  # A is the endpoint itself
    png = (tmp_path / "run" / plane["figure"]).read_bytes()
    assert plane["figure"] == str(Path("weight") / "plane_0-1.png") and png[:8] == b"\x89PNG\r\n\x1a\n"


def test_endpoints_planes_are_measured_once_per_pair(tmp_path):
    cfg = compose_config("eval.plane.enabled=true", "eval.plane.grid=2", "eval.plane.models=endpoints")
    ends = [SimpleNamespace(model=tiny_vit(seed, layers=1), label=str(seed)) for seed in (0, 1, 2)]
    logged = []
    run = SimpleNamespace(
        cfg=cfg,
        run_dir=tmp_path,
        endpoints=ends,
        evaluator=Evaluator(images(), progress=False),
        tracker=SimpleNamespace(log_image=lambda key, path: logged.append(key)),
    )
    first = plane_record(run, "vanilla", "1-2", None, (ends[1], ends[2]))
    again = plane_record(run, "weight", "1-2", None, (ends[1], ends[2]))
    assert first is again and first["models"] == ["1", "2", "0"] and logged == ["plane/vanilla/1-2"]
    assert (tmp_path / first["figure"]).exists()
    two = SimpleNamespace(**{**vars(run), "endpoints": ends[:2], "run_dir": tmp_path / "two"})
    assert "third endpoint" in plane_record(two, "vanilla", "0-1", None, (ends[0], ends[1]))["skipped"]
