"""End to end on the embedded digits data with a tiny ViT: outputs, cache reuse, determinism."""

from __future__ import annotations

import csv
import json
import math

from glmc.pipeline.cache import EndpointCache
from glmc.pipeline.endpoints import cache_key
from glmc.pipeline.run import run_pipeline

from conftest import compose_config


def test_tiny_run_writes_three_sane_outputs(tmp_path, tiny_overrides):
    cfg = compose_config(*tiny_overrides, "seeds=[0,3]")
    results = run_pipeline(cfg, tmp_path / "run")
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["experiment"] == "debug" and saved["model"] == "vit_digits_p4" and saved["dataset"] == "digits"
    assert [e["seed"] for e in saved["endpoints"]] == [0, 3]
    for e in saved["endpoints"]:
        assert math.isfinite(e["test_loss"]) and 0.0 <= e["test_accuracy"] <= 1.0
    vanilla = saved["methods"]["vanilla"]
    assert vanilla["lambdas"] == [0.0, 0.5, 1.0]
    assert len(vanilla["test_loss"]) == len(vanilla["test_accuracy"]) == 3
    # The path's ends are the endpoints themselves (lam=1 is A = seed 0, lam=0 is B = seed 3).
    assert math.isclose(vanilla["test_loss"][-1], saved["endpoints"][0]["test_loss"], rel_tol=1e-5)
    assert math.isclose(vanilla["test_loss"][0], saved["endpoints"][1]["test_loss"], rel_tol=1e-5)
    assert vanilla["barrier"] >= 0.0
    assert vanilla["seconds"] >= 0.0
    assert results["methods"]["vanilla"]["barrier"] == vanilla["barrier"]
    with open(tmp_path / "run" / "barrier.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["method", "lambda", "split", "loss", "accuracy"]
    assert [float(r["loss"]) for r in rows if r["method"] == "vanilla"] == vanilla["test_loss"]
    assert {r["method"] for r in rows} == set(saved["methods"])
    png = (tmp_path / "run" / "barrier.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_cache_is_reused_and_keyed_by_training_config(tmp_path, tiny_overrides, monkeypatch):
    cfg = compose_config(*tiny_overrides)
    first = run_pipeline(cfg, tmp_path / "a")
    assert not any(e["cached"] for e in first["endpoints"])

    import glmc.pipeline.endpoints as endpoints

    def no_training(*args, **kwargs):
        raise AssertionError("a cached endpoint was retrained")

    monkeypatch.setattr(endpoints, "train_endpoint", no_training)
    second = run_pipeline(cfg, tmp_path / "b")
    assert all(e["cached"] for e in second["endpoints"])
    assert second["methods"]["vanilla"]["test_loss"] == first["methods"]["vanilla"]["test_loss"]

    changed = compose_config(*tiny_overrides, "train.lr=0.01")
    assert EndpointCache(tmp_path / "endpoints").entry(cache_key(changed), 0) != EndpointCache(
        tmp_path / "endpoints"
    ).entry(cache_key(cfg), 0)
    # Evaluation-only settings do not invalidate trained endpoints.
    assert cache_key(compose_config(*tiny_overrides, "data.eval_batch_size=7", "eval.num_lambdas=5")) == cache_key(cfg)
    try:
        run_pipeline(changed, tmp_path / "c")
    except AssertionError as err:
        assert "retrained" in str(err)
    else:
        raise AssertionError("a changed training config must get a new cache entry")


def test_same_seeds_give_identical_numbers(tmp_path, tiny_overrides):
    numbers = []
    for i in range(2):
        cfg = compose_config("debug=fast", f"cache_dir={tmp_path / f'cache{i}'}", "logger=none", "seeds=[0,1]")
        r = run_pipeline(cfg, tmp_path / f"run{i}")
        numbers.append(([e["test_loss"] for e in r["endpoints"]], r["methods"]["vanilla"]["test_loss"]))
    assert numbers[0] == numbers[1]
    cfg = compose_config("debug=fast", f"cache_dir={tmp_path / 'cache2'}", "logger=none", "seeds=[2,1]")
    other = run_pipeline(cfg, tmp_path / "run2")
    assert [e["test_loss"] for e in other["endpoints"]][0] != numbers[0][0][0]


def test_several_pairs_report_standard_error(tmp_path, tiny_overrides):
    cfg = compose_config(*tiny_overrides, "seeds=[0,1,2,3]")
    vanilla = run_pipeline(cfg, tmp_path / "run")["methods"]["vanilla"]
    assert [p["seeds"] for p in vanilla["pairs"]] == [[0, 1], [2, 3]]
    assert vanilla["barrier_se"] is not None and vanilla["barrier_se"] >= 0.0
    assert math.isclose(vanilla["barrier"], sum(p["barrier"] for p in vanilla["pairs"]) / 2)


def test_cli_writes_into_hydra_run_dir(tmp_path, monkeypatch, capsys):
    from conftest import run_script

    run_dir = tmp_path / "chosen"
    args = ["debug=fast", "logger=none", "matcher.methods=[vanilla,weight]", f"cache_dir={tmp_path / 'endpoints'}"]
    code, out, err = run_script(monkeypatch, capsys, *args, f"hydra.run.dir={run_dir}")
    assert code == 0, err[-2000:]
    assert {"results.json", "barrier.csv", "barrier.png"} <= {p.name for p in run_dir.iterdir()}
    assert "vanilla" in out and "weight" in out


def test_unknown_method_fails_before_training(tmp_path, tiny_overrides):
    import pytest

    cfg = compose_config(*tiny_overrides, "matcher.methods=[vanilla,wieght]")
    with pytest.raises(ValueError, match="wieght"):
        run_pipeline(cfg, tmp_path / "run")
    assert not (tmp_path / "endpoints").exists()


def test_eval_split_train_evaluates_paths_on_the_unaugmented_training_split(tmp_path, tiny_overrides):
    from glmc.data.module import DataModule
    from glmc.eval.evaluator import evaluate
    from glmc.pipeline.cache import EndpointCache

    cfg = compose_config(*tiny_overrides, "eval.split=train", "matcher.methods=[vanilla]")
    results = run_pipeline(cfg, tmp_path / "run")
    assert results["split"] == "train"
    data = DataModule(cfg.data, seed=0)
    data.setup()
    loader = data.eval_dataloader("train")
    assert len(loader.dataset) == cfg.data.limit_train
    from glmc.models.build import build_model

    model_a = build_model(cfg.model)
    EndpointCache(tmp_path / "endpoints").load(cache_key(cfg), 0, model_a)
    train_loss, _ = evaluate(model_a, loader)
    curve = results["methods"]["vanilla"]["test_loss"]
    assert math.isclose(curve[-1], train_loss, rel_tol=1e-5)  # lambda = 1 is A, on the training split
    assert not math.isclose(curve[-1], results["endpoints"][0]["test_loss"], rel_tol=1e-3)
