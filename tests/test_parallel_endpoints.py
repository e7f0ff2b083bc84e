"""train.parallel_endpoints: endpoints trained side by side in spawned processes are the ones the sequential
loop trains (the same cached weights bit for bit, the same barriers), a cached seed is not sent to a
worker, and a worker's failure names its seed.

Both runs train on one torch thread per process (the sequential run here, each of the two workers
there): CPU kernels then sum in one order, so the weights must be equal, not merely close. With another
thread count per process they may differ in the last bits, as with `threads`."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch
from safetensors.torch import load_file

import glmc.pipeline.endpoints as endpoints
from glmc.pipeline.cache import EndpointCache, config_hash
from glmc.pipeline.endpoints import cache_key, train_seed
from glmc.pipeline.run import run_pipeline
from glmc.pipeline.side_by_side import SeedFailed, SideBySideRefusal, raise_failures
from glmc.pipeline.validate import ConfigError, validate_config

from conftest import compose_config

RUN = ("debug=fast", "logger=none", "seeds=[0,1,2]", "pairing=first", "matcher.methods=[vanilla,weight]")


def _entries(cache_dir, key, seed):
    entry = EndpointCache(cache_dir).entry(key, seed)
    return load_file(entry / "model.safetensors"), json.loads((entry / "meta.json").read_text())["metrics"]


def test_side_by_side_endpoints_are_the_sequential_ones(tmp_path, one_thread, monkeypatch, caplog):
    one = compose_config(*RUN, f"cache_dir={tmp_path / 'one'}")
    two = compose_config(*RUN, f"cache_dir={tmp_path / 'two'}", "train.parallel_endpoints=2")
    key = cache_key(one)
    assert cache_key(two) == key  # how many train at once is not part of what an endpoint is
    sequential = run_pipeline(one, tmp_path / "run_one")
    # seed 0 is cached already where the side-by-side run looks: only seeds 1 and 2 go to the workers
    seed0 = EndpointCache(tmp_path / "two").entry(key, 0)
    shutil.copytree(EndpointCache(tmp_path / "one").entry(key, 0), seed0)
    stamp = (seed0 / "model.safetensors").stat().st_mtime_ns

    def no_training_here(*args, **kwargs):
        raise AssertionError("the run trained an endpoint in its own process")

    monkeypatch.setattr(endpoints, "train_endpoint", no_training_here)  # the workers are other processes
    with caplog.at_level(logging.INFO):
        side_by_side = run_pipeline(two, tmp_path / "run_two")
    assert "seeds [1, 2]: training side by side, 2 at a time (1 torch threads each)" in caplog.text
    assert "seed 1: training (cache entry" in caplog.text  # a worker's record, written by this process
    assert (seed0 / "model.safetensors").stat().st_mtime_ns == stamp
    assert [e["cached"] for e in sequential["endpoints"]] == [False, False, False]
    assert [e["cached"] for e in side_by_side["endpoints"]] == [True, False, False]
    for seed in (1, 2):
        weights_one, metrics_one = _entries(tmp_path / "one", key, seed)
        weights_two, metrics_two = _entries(tmp_path / "two", key, seed)
        assert weights_one.keys() == weights_two.keys()
        assert all(torch.equal(weights_one[name], weights_two[name]) for name in weights_one), seed
        assert metrics_one == metrics_two
    assert not list((tmp_path / "two" / config_hash(key)).glob(".train_seed_*"))  # checkpoints removed
    saved = [json.loads((tmp_path / run / "results.json").read_text()) for run in ("run_one", "run_two")]
    for method in ("vanilla", "weight"):
        assert saved[0]["methods"][method]["barrier"] == saved[1]["methods"][method]["barrier"]
        assert saved[0]["methods"][method]["test_loss"] == saved[1]["methods"][method]["test_loss"]
    assert [e["test_loss"] for e in saved[0]["endpoints"]] == [e["test_loss"] for e in saved[1]["endpoints"]]


def test_a_worker_failure_names_its_seed(tmp_path, monkeypatch):
    """What a worker runs, called here: its error comes back as SeedFailed with the seed and a traceback."""
    cfg = compose_config(*RUN, f"cache_dir={tmp_path / 'cache'}")

    def fails(*args, **kwargs):
        raise ValueError("no room on the device")

    monkeypatch.setattr(endpoints, "train_endpoint", fails)
    with pytest.raises(SeedFailed) as caught:
        train_seed(cfg, 2, cache_key(cfg), str(tmp_path / "run"))
    assert caught.value.seed == 2 and str(caught.value) == "seed 2: no room on the device"
    assert "ValueError" in caught.value.trace


def test_failures_are_reported_together_by_seed():
    refused = [SeedFailed(3, "seed 3: diverged at step 7", True, "trace 3"), SeedFailed(1, "bad input", True, "t1")]
    with pytest.raises(SideBySideRefusal, match=r"^seed 1: bad input; seed 3: diverged at step 7$"):
        raise_failures(refused)
    crashed = [*refused, SeedFailed(5, "its worker process stopped (BrokenProcessPool: gone)", False, "")]
    with pytest.raises(RuntimeError, match="seed 5: its worker process stopped") as caught:
        raise_failures(crashed)
    assert not isinstance(caught.value, SideBySideRefusal) and "trace 3" in str(caught.value)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (("train.parallel_endpoints=0",), "train.parallel_endpoints=0: use at least 1"),
        (("train.parallel_endpoints=2", "trainer=ddp_cpu"), "train.parallel_endpoints=2: each endpoint trains"),
    ],
)
def test_parallel_endpoints_refusals(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate_config(compose_config("debug=fast", *overrides))
