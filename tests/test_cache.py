"""Endpoint cache: round trip, atomic writes, no code unpickled on load."""

from __future__ import annotations

import json

import pytest
import torch

from glmc.pipeline.cache import META, WEIGHTS, CorruptEntryError, EndpointCache, config_hash, endpoint_key

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
    with (
        pytest.warns(RuntimeWarning, match="moved it aside"),
        pytest.raises(CorruptEntryError, match="different config"),
    ):
        cache.load(KEY, 0, torch.nn.Linear(4, 3))
    assert not cache.has(KEY, 0)  # moved aside, so the caller trains it again


def _edit_meta(cache: EndpointCache, entry_seed: int, changes: dict) -> None:
    """Rewrite the entry's meta.json with `changes` (a value of None removes the key)."""
    meta_path = cache.entry(KEY, entry_seed) / META
    meta = json.loads(meta_path.read_text())
    meta.update(changes)
    meta_path.write_text(json.dumps({k: v for k, v in meta.items() if v is not None}))


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"sha256": None}, "records no sha256 of model.safetensors"),
        ({"sha256": None, "seed": 1}, "records seed 1 in its meta.json, not seed 0"),
        ({"seed": 1}, "records seed 1 in its meta.json, not seed 0"),
        ({"sha256": "not a checksum"}, "records no sha256 of model.safetensors"),
    ],
)
def test_entry_without_checksum_or_of_another_seed_is_moved_aside(tmp_path, changes, message):
    cache = EndpointCache(tmp_path)
    torch.manual_seed(0)
    cache.save(KEY, 0, torch.nn.Linear(4, 3), {"test_loss": 1.5})
    _edit_meta(cache, 0, changes)
    target = torch.nn.Linear(4, 3)
    before = target.weight.detach().clone()
    with pytest.warns(RuntimeWarning, match=r"seed_0 is a damaged endpoint cache entry") as caught:
        with pytest.raises(CorruptEntryError, match=message):
            cache.load(KEY, 0, target)
    assert any(message in str(w.message) for w in caught)  # the warning says why
    assert torch.equal(target.weight, before)  # nothing was loaded from the entry
    assert not cache.has(KEY, 0)
    assert len(list(cache.entry(KEY, 0).parent.glob("seed_0.corrupt-*"))) == 1
    # rebuilt: a fresh save is trusted again
    cache.save(KEY, 0, torch.nn.Linear(4, 3), {"test_loss": 2.0})
    assert cache.load(KEY, 0, torch.nn.Linear(4, 3))["metrics"]["test_loss"] == 2.0


def test_weights_file_is_plain_safetensors(tmp_path):
    cache = EndpointCache(tmp_path)
    cache.save(KEY, 0, torch.nn.Linear(4, 3), {})
    raw = (cache.entry(KEY, 0) / WEIGHTS).read_bytes()
    header_len = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + header_len])
    assert set(header) - {"__metadata__"} == {"weight", "bias"}
