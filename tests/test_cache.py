"""Endpoint cache: round trip, atomic writes, no code unpickled on load."""

from __future__ import annotations

import json

import pytest
import torch

from glmc.pipeline.cache import META, WEIGHTS, EndpointCache, config_hash, endpoint_key

KEY = endpoint_key(
    {"width": 4},
    {
        "name": "d",
        "task": "c",
        "batch_size": 2,
        "test_fraction": 0.2,
        "split_seed": 0,
        "augment": False,
        "limit_train": None,
    },
    {"lr": 0.1},
    {"precision": "32-true"},
    {"corpus": "0" * 64, "tokenizer": None},
)


def test_round_trip_restores_weights(tmp_path):
    cache = EndpointCache(tmp_path)
    model = torch.nn.Linear(4, 3)
    cache.save(KEY, 0, model, {"test_loss": 1.5})
    assert cache.has(KEY, 0) and not cache.has(KEY, 1)
    fresh = torch.nn.Linear(4, 3)
    meta = cache.load(KEY, 0, fresh)
    assert meta["metrics"]["test_loss"] == 1.5 and meta["seed"] == 0
    assert torch.equal(fresh.weight, model.weight)
    assert sorted(p.name for p in cache.entry(KEY, 0).iterdir()) == [META, WEIGHTS]


def test_killed_write_leaves_no_trusted_entry(tmp_path, monkeypatch):
    cache = EndpointCache(tmp_path)
    import glmc.pipeline.cache as module

    def crash(*args, **kwargs):
        raise KeyboardInterrupt  # what a killed run looks like from inside

    monkeypatch.setattr(module.Path, "write_text", crash)
    with pytest.raises(KeyboardInterrupt):
        cache.save(KEY, 0, torch.nn.Linear(4, 3), {})
    monkeypatch.undo()
    assert not cache.has(KEY, 0)
    assert list((tmp_path / config_hash(KEY)).iterdir()) == []  # the temporary folder is gone too


def test_entry_with_foreign_config_is_refused(tmp_path):
    cache = EndpointCache(tmp_path)
    cache.save(KEY, 0, torch.nn.Linear(4, 3), {})
    meta_path = cache.entry(KEY, 0) / META
    meta = json.loads(meta_path.read_text())
    meta["key"]["train"]["lr"] = 0.2
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(RuntimeError, match="different config"):
        cache.load(KEY, 0, torch.nn.Linear(4, 3))


def test_weights_file_is_plain_safetensors(tmp_path):
    cache = EndpointCache(tmp_path)
    cache.save(KEY, 0, torch.nn.Linear(4, 3), {})
    raw = (cache.entry(KEY, 0) / WEIGHTS).read_bytes()
    header_len = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + header_len])
    assert set(header) - {"__metadata__"} == {"weight", "bias"}
