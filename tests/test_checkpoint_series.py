"""Checkpoint series (train.save_steps): snapshots beside the cached endpoint leave it the same bit for bit,
the last one is the endpoint, a run measures every method at every saved step, and a rerun trains nothing."""

from __future__ import annotations

import copy
import json
import re
import shutil
import sys
import types
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import glmc.pipeline.endpoints as endpoint_stage
from glmc.models.build import build_model
from glmc.pipeline.cache import EndpointCache
from glmc.pipeline.endpoints import cache_key, train_endpoint
from glmc.pipeline.matrix import read_matrix_csv
from glmc.pipeline.previous_outputs import previous_outputs
from glmc.pipeline.run import run_pipeline
from glmc.pipeline.series import series_lines, series_problems, write_connectivity
from glmc.pipeline.tracking import Tracker
from glmc.pipeline.validate import ConfigError, validate_config
from glmc.train.snapshots import load_snapshot, planned_steps, recorded_total, snapshot_dir

from conftest import compose_config
from tiny_hf import tiny_vit


def same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_planned_steps_every_n_or_listed_and_always_the_last():
    assert planned_steps(4, 10) == [0, 4, 8, 10]
    assert planned_steps([3, 1], 10) == [1, 3, 10]
    with pytest.raises(ValueError, match=r"train.save_steps=\[5, 12\]: step 12 is past the end of training \(10"):
        planned_steps([5, 12], 10)


@pytest.mark.parametrize(
    ("settings", "refusal"),
    [
        ({"train.save_steps": 0}, "save every N >= 1"),
        ({"train.save_steps": [0, 5, 5]}, "distinct steps >= 0"),
        ({"train.save_steps": [-1]}, "distinct steps >= 0"),
        ({"train.save_steps": []}, "list one or more distinct steps"),
        ({"train.save_steps": [1.5]}, "give an int N"),
        ({"train.save_steps": 2, "train.early_stopping_patience": 1}, "set train.early_stopping_patience=null"),
        ({"train.save_steps": 2, "endpoints.source": "pretrained"}, "endpoints=trained"),
        ({"train.save_steps": 2, "pairing": "universe"}, "use pairing=disjoint, all or first"),
    ],
)
def test_settings_a_series_cannot_honour_are_refused_by_name(settings, refusal):
    cfg = compose_config()
    for key, value in settings.items():
        OmegaConf.update(cfg, key, value)
    problems = series_problems(cfg)
    assert len(problems) == 1 and problems[0].startswith("train.save_steps=") and refusal in problems[0]


def test_a_run_measures_every_method_at_every_saved_step_and_a_rerun_trains_nothing(
    tmp_path, tiny_overrides, monkeypatch, caplog
):
    cfg = compose_config(
        *tiny_overrides,
        "seeds=[0,1,2]",
        "pairing=all",
        "matcher.methods=[vanilla,weight]",
        "train.max_epochs=1",
        "data.limit_train=128",  # two optimizer steps
        "train.save_steps=1",
    )
    results = run_pipeline(cfg, tmp_path / "run")
    series = results["series"]
    assert series["steps"] == [0, 1, 2]
    assert "differs from the cached endpoint" not in caplog.text  # the last snapshot is the endpoint
    for name, method in results["methods"].items():  # the last step is the finished endpoints
        assert series["barrier"]["2"][name] == pytest.approx(method["barrier"], abs=1e-9)
        assert series["pair_barriers"]["2"][name] == pytest.approx([p["barrier"] for p in method["pairs"]])
    last = [losses[-1] for losses in series["endpoint_loss"].values()]
    assert last == pytest.approx([e["test_loss"] for e in results["endpoints"]], abs=1e-6)
    assert series["barrier"]["0"]["vanilla"] != series["barrier"]["2"]["vanilla"]
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["series"]["barrier"] == series["barrier"]
    vanilla = saved["matrix"]["pairwise"]["vanilla"]
    assert read_matrix_csv(tmp_path / "run" / "matrix_vanilla.csv") == (["0", "1", "2"], vanilla["barriers"])
    pair_12 = results["methods"]["vanilla"]["pairs"][2]
    assert pair_12["seeds"] == [1, 2] and vanilla["barriers"][1][2] == vanilla["barriers"][2][1] == pair_12["barrier"]
    written = {p.relative_to(tmp_path / "run").as_posix() for p in previous_outputs(tmp_path / "run")}
    assert {
        "series.png",
        "matrix.png",
        "matrix_vanilla.csv",
        "matrix_weight.csv",
        "series/step_0/weight/diagnostics_0-1.json",
    } <= written

    # the cached endpoint is its last snapshot, and what training without snapshots gives, bit for bit
    cached = build_model(cfg.model)
    EndpointCache(Path(cfg.cache_dir)).load(cache_key(cfg), 0, cached)
    folder = snapshot_dir(EndpointCache(Path(cfg.cache_dir)).entry(cache_key(cfg), 0).parent, 0)
    assert recorded_total(folder) == 2 and same(load_snapshot(build_model(cfg.model), folder, 2), cached)
    assert not same(load_snapshot(build_model(cfg.model), folder, 0), cached)  # training moved it
    plain = copy.deepcopy(cfg)
    plain.train.save_steps = None
    trained, _ = train_endpoint(plain, 0, tmp_path / "plain", logger=False, checkpoint_dir=tmp_path / "h" / ".t")
    assert same(trained, cached) and not (tmp_path / "h" / "steps_seed_0").exists()

    def no_training(*args, **kwargs):
        raise AssertionError("trained again")

    monkeypatch.setattr(endpoint_stage, "train_endpoint", no_training)
    monkeypatch.setattr("glmc.pipeline.run.write_connectivity", lambda *args: [])  # drawn above: not again
    monkeypatch.setattr("glmc.pipeline.outputs.plot_barrier_curves", lambda methods, path, title: None)
    monkeypatch.setattr("glmc.pipeline.series.train_endpoint", no_training)
    shutil.copy(folder / "step_0.safetensors", folder / "step_2.safetensors")  # as if trained again elsewhere
    again = run_pipeline(cfg, tmp_path / "again")
    assert again["series"]["barrier"]["1"] == series["barrier"]["1"]
    assert "seed 0: the snapshot of the last step differs from the cached endpoint" in caplog.text


def test_folders_given_as_a_series_are_measured_at_every_position(tmp_path, tiny_overrides, monkeypatch):
    monkeypatch.setattr("glmc.pipeline.run.write_connectivity", lambda *args: [])  # figures: tested above
    monkeypatch.setattr("glmc.pipeline.outputs.plot_barrier_curves", lambda methods, path, title: None)
    lists = []
    for seed, who in enumerate("ab"):
        for step in (0, 5):
            tiny_vit(10 * seed + step).save_pretrained(tmp_path / who / f"step{step}")
        lists.append(f"[{tmp_path / who / 'step0'},{tmp_path / who / 'step5'}]")
    paths = f"endpoints.paths=[{','.join(lists)}]"
    cfg = compose_config(*tiny_overrides, "endpoints=pretrained", paths, "matcher.methods=[vanilla]")
    results = run_pipeline(cfg, tmp_path / "run")
    assert [e["path"] for e in results["endpoints"]] == [str(tmp_path / w / "step5") for w in "ab"]
    series = results["series"]
    assert series["steps"] == [0, 5]  # the number the folders' names end in
    assert series["barrier"]["5"]["vanilla"] == pytest.approx(results["methods"]["vanilla"]["barrier"], abs=1e-9)
    first, last = zip(*series["endpoint_loss"].values())  # each position loads its own folders
    assert last == pytest.approx([e["test_loss"] for e in results["endpoints"]]) and first != last
    assert len(results["config"]["endpoints"]["paths"][0]) == 2  # the series as given


@pytest.mark.parametrize(
    ("paths", "refusal"),
    [
        ([["a/1", "a/2"], "b/2"], "endpoints.paths[1]=b/2 is one folder, endpoints.paths[0] a list"),
        ([["a/1", "a/2"], ["b/1"]], "endpoints.paths: lists of [2, 1] folders"),
        ([["a/1"], []], "endpoints.paths: lists of [1, 0] folders"),
        ([["a/1", ["a/2"]], ["b/1", "b/2"]], "endpoints.paths[0]: holds a list or mapping"),
    ],
)
def test_folder_series_of_the_wrong_shape_are_refused_by_name(paths, refusal):
    cfg = compose_config("endpoints=pretrained")
    cfg.endpoints.paths = paths
    with pytest.raises(ConfigError, match=re.escape(refusal)):
        validate_config(cfg)


class Recorded:
    """A W&B run that keeps what is logged to it."""

    def __init__(self):
        self.logged: dict = {}

    def log(self, row: dict) -> None:
        self.logged.update(row)


def test_the_series_is_logged_to_wandb_as_a_line_plot_beside_its_figure(tmp_path, monkeypatch):
    # W&B's own plot and image objects, recorded (wandb.plot.line_series takes these keywords)
    plots = types.SimpleNamespace(line_series=lambda xs, ys, keys, xname, title: ("lines", keys, xs, ys, xname))
    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(plot=plots, Image=lambda path: ("image", path)))
    series = {
        "steps": [0, 10],
        "source": "train.save_steps",
        "barrier": {"0": {"vanilla": 0.5, "weight": 0.2}, "10": {"vanilla": 0.3, "weight": 0.1}},
        "pair_barriers": {"0": {"vanilla": [0.5], "weight": [0.2]}, "10": {"vanilla": [0.3], "weight": [0.1]}},
        "endpoint_loss": {"0": [2.0, 1.0], "1": [2.2, 1.2]},
    }
    results = {"model": "m", "dataset": "d", "series": series}
    drawn = lambda series, path, title: path.write_bytes(b"png") and path  # noqa: E731 (drawn in the run above)
    monkeypatch.setattr("glmc.pipeline.series.plot_series", drawn)
    tracker = Tracker(compose_config("logger=wandb"), tmp_path)
    tracker.run = Recorded()
    files = write_connectivity(results, tmp_path, tracker)
    assert [f.name for f in files] == ["series.png"] and (tmp_path / "series.png").stat().st_size > 0
    assert set(tracker.run.logged) == {"series/barrier", "series/png"}
    lines = tracker.run.logged["series/barrier"]
    assert lines[1] == ["vanilla", "weight", "endpoint loss"] and lines[2] == [[0, 10]] * 3
    assert series_lines(series) == {"vanilla": [0.5, 0.3], "weight": [0.2, 0.1], "endpoint loss": [2.1, 1.1]}
