"""W&B logging runs offline without network and finishes even when the run fails."""
from __future__ import annotations

import os

import pytest

from conftest import compose_config
from glmc.pipeline.run import run_pipeline
from glmc.pipeline.tracking import Tracker


@pytest.fixture(autouse=True)
def no_wandb_network(monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)


def test_offline_run_is_written(tmp_path):
    cfg = compose_config("debug=fast", f"cache_dir={tmp_path / 'endpoints'}", "logger=wandb")
    assert cfg.logger.mode == "offline"
    run_pipeline(cfg, tmp_path / "run")
    runs = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    logs = list(runs[0].glob("run-*.wandb"))
    assert logs and logs[0].stat().st_size > 0


def test_curves_and_summary_are_logged(tmp_path):
    cfg = compose_config("debug=fast", "logger=wandb")
    results = {
        "endpoints": [{"seed": 0, "test_loss": 0.1, "test_accuracy": 0.9}],
        "methods": {"vanilla": {"lambdas": [0.0, 1.0], "test_loss": [0.2, 0.1], "test_accuracy": [0.8, 0.9],
                                "barrier": 0.0, "barrier_vs_mean": 0.05}},
    }
    with Tracker(cfg, tmp_path) as tracker:
        tracker.log_results(results)
        summary = dict(tracker.run.summary)
    assert summary["vanilla/barrier"] == 0.0 and summary["seed_0/test_accuracy"] == 0.9
    assert tracker.run is None  # finished on exit


def test_failed_run_still_finishes(tmp_path):
    import wandb

    cfg = compose_config("debug=fast", "logger=wandb")
    with pytest.raises(RuntimeError, match="boom"):
        with Tracker(cfg, tmp_path):
            raise RuntimeError("boom")
    assert wandb.run is None
