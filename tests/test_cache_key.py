"""The endpoint cache key: every setting that can change the trained weights is in it, the data's
checksums too, and two runs building one entry take turns through its file lock."""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import fields
from functools import lru_cache

import pytest
import torch
from filelock import FileLock

from glmc.config import DataConfig, TrainerConfig
from glmc.data.fingerprint import tree_checksum
from glmc.pipeline.cache import NOT_WEIGHTS, EndpointCache, config_hash
from glmc.pipeline.endpoints import cache_key

from conftest import compose_config

# a value of the same type as the default, different from it, per field that the key must hold
CHANGED = {
    "data": {
        "name": "pydoc",
        "task": "causal_lm",
        "batch_size": 7,
        "test_fraction": 0.3,
        "val_fraction": 0.15,
        "split_seed": 3,
        "augment": True,
        "num_workers": 2,
        "limit_train": 40,
        "image_size": 16,
        "tokenizer": "gpt2",
        "seq_len": 64,
        "tokenizer_vocab": 500,
        "mask_prob": 0.2,
        "mask_seed": 1,
        "subset": 1,
        "num_subsets": 2,
    },
    "trainer": {
        "accelerator": "gpu",
        "devices": 2,
        "strategy": "ddp",
        "num_nodes": 2,
        "precision": "bf16-mixed",
        "deterministic": False,
        "limit_train_batches": 0.25,
    },
}


@lru_cache(maxsize=1)
def _base_key():
    return cache_key(compose_config("debug=fast"))


def _schema_fields(schema) -> list[str]:
    return [f.name for f in fields(schema)]


def test_every_field_is_in_the_key_or_on_the_allow_list():
    """A field added to the schema later is part of the key unless someone lists it as harmless."""
    for section, schema in (("data", DataConfig), ("trainer", TrainerConfig)):
        for name in _schema_fields(schema):
            if name not in NOT_WEIGHTS[section]:
                assert name in CHANGED[section], f"{section}.{name}: add a changed value to this test"


@pytest.mark.parametrize(
    "override",
    [f"data.{k}={v}" for k, v in CHANGED["data"].items()]
    + [f"trainer.{k}={v}" for k, v in CHANGED["trainer"].items()]
    + ["model.layer_norm_eps=1e-5", "model.hidden_size=32", "train.max_epochs=3", "train.label_smoothing=0.1"],
)
def test_a_setting_that_changes_the_weights_changes_the_key(override):
    assert config_hash(cache_key(compose_config("debug=fast", override))) != config_hash(_base_key())


@pytest.mark.parametrize(
    "override",
    ["data.eval_batch_size=7", "data.limit_test=5", "data.download=true", "trainer.enable_progress_bar=false"]
    + ["trainer.log_every_n_steps=3", "eval.num_lambdas=5", "matcher.methods=[weight]", "logger=none"],
)
def test_evaluation_and_display_settings_keep_the_key(override):
    assert cache_key(compose_config("debug=fast", override)) == _base_key()


def _shakespeare(root, text):
    folder = root / "tiny_shakespeare"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "input.txt").write_text(text, encoding="utf-8")


def test_the_corpus_and_tokenizer_enter_the_key_by_content_not_by_folder(tmp_path):
    corpus = "To be, or not to be, that is the question.\n" * 40
    _shakespeare(tmp_path / "a", corpus)
    _shakespeare(tmp_path / "b", corpus)  # the same file in another folder: the same data
    _shakespeare(tmp_path / "c", corpus.replace("question", "answer!!"))  # same length, other text
    key = lambda root: cache_key(compose_config("experiment=text_demo", "data=tiny_shakespeare", f"data.root={root}"))
    a, b, c = key(tmp_path / "a"), key(tmp_path / "b"), key(tmp_path / "c")
    assert a == b
    assert a != c and a["sources"]["corpus"] != c["sources"]["corpus"]
    # a saved tokenizer's files are summed too
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text('{"model": 1}')
    first = tree_checksum(tmp_path / "tok")
    (tmp_path / "tok" / "tokenizer.json").write_text('{"model": 2}')
    assert tree_checksum(tmp_path / "tok") != first


def test_the_checksums_are_recorded_in_the_entry(tmp_path):
    cfg = compose_config("debug=fast")
    key = cache_key(cfg)
    assert len(key["sources"]["corpus"]) == 64
    cache = EndpointCache(tmp_path)
    entry = cache.save(key, 0, torch.nn.Linear(2, 2), {"test_loss": 1.0})
    assert cache.load(key, 0, torch.nn.Linear(2, 2))["key"]["sources"] == key["sources"]
    assert entry.parent.name == config_hash(key)


def test_a_second_run_waits_for_the_entry_and_loads_it(tmp_path, caplog):
    """While another process holds an entry's lock, the pipeline neither trains nor loads; once the
    holder has cached the endpoint and let go, the waiting run loads that entry."""
    from glmc.models.build import build_model
    from glmc.pipeline import endpoints

    cfg = compose_config("debug=fast", f"cache_dir={tmp_path / 'cache'}", "logger=none", "seeds=[0,1]")
    cache = EndpointCache(tmp_path / "cache")
    keys = [cache_key(endpoints.endpoint_config(cfg, i)) for i in range(2)]
    holder, held = FileLock(str(cache.lock_path(keys[0], 0))), threading.Event()
    for i, seed in enumerate(cfg.seeds):  # seed 1 is cached already; seed 0 is "being trained" by the holder
        if seed == 1:
            cache.save(keys[i], seed, build_model(cfg.model), {"test_loss": 1.0, "test_accuracy": 0.5})
    trained = []

    finished = build_model(cfg.model)

    waiting = threading.Event()

    class SeesTheWait(logging.Handler):  # the holder finishes once the run says it waits, however slow it is
        def emit(self, record):
            if "another run is training this endpoint" in record.getMessage():
                waiting.set()

    def finish_elsewhere():
        holder.acquire()
        held.set()
        waiting.wait(timeout=300)  # (a bound on a failing run only)
        cache.save(keys[0], 0, finished, {"test_loss": 2.0, "test_accuracy": 0.25})
        holder.release()

    class Tracker:
        lightning_logger = staticmethod(lambda *a: False)

    class Measured:  # the endpoints' test metrics are measured again when loaded
        evaluate = staticmethod(lambda model: (1.0, 0.5))

    thread = threading.Thread(target=finish_elsewhere)
    thread.start()
    held.wait()
    original = endpoints.train_endpoint
    endpoints.train_endpoint = lambda *a, **k: trained.append(a) or original(*a, **k)
    sees = SeesTheWait()
    logging.getLogger("glmc").addHandler(sees)
    try:
        with caplog.at_level(logging.INFO, logger="glmc"):
            found = endpoints.get_endpoints(cfg, tmp_path / "run", Tracker(), Measured())
    finally:
        endpoints.train_endpoint = original
        waiting.set()
        thread.join()
        logging.getLogger("glmc").removeHandler(sees)
    assert not trained
    assert all(e.cached for e in found)
    for name, tensor in finished.state_dict().items():  # the waiting run holds what the other one cached
        assert torch.equal(found[0].model.state_dict()[name], tensor)
    assert "another run is training this endpoint" in caplog.text
    assert "finished by the run it waited for" in caplog.text


@pytest.mark.slow
def test_a_joblib_sweep_on_an_empty_cache_trains_each_endpoint_once(tmp_path, monkeypatch, capsys):
    """Two jobs started together need the same two endpoints: one job trains each, the other waits."""
    from joblib.externals.loky.backend import context as loky_context

    import glmc.pipeline.run  # noqa: F401  (imported before the workers fork: they keep it)

    from conftest import run_script

    # Hydra's joblib launcher always picks loky, whose fresh interpreters spend seconds importing torch and
    # Lightning each; forked workers keep this process's imports and are processes all the same,
    # coordinating through the cache's file locks
    monkeypatch.setattr(loky_context, "_DEFAULT_START_METHOD", "fork")
    sweep = tmp_path / "sweep"
    command = [
        "-m",
        "hydra/launcher=local_grid",
        "hydra.launcher.n_jobs=2",
        "threads=1",
        "debug=fast",
        "logger=none",
        "train.max_epochs=1",
        "data.limit_train=128",
        "matcher.methods=[vanilla],[canonical]",
        f"cache_dir={tmp_path / 'cache'}",
        f"hydra.sweep.dir={sweep}",
        "hydra.sweep.subdir=${hydra.job.num}",
    ]
    code, out, err = run_script(monkeypatch, capsys, *command)  # the jobs run in joblib's worker processes
    assert code == 0, out[-2000:] + err[-2000:]
    logs = "".join((sweep / str(job) / "run.log").read_text() for job in (0, 1))
    for seed in (0, 1):
        assert logs.count(f"seed {seed}: training (cache entry") == 1, logs
    for job, method in enumerate(("vanilla", "canonical")):
        assert list(json.loads((sweep / str(job) / "results.json").read_text())["methods"]) == [method]
