"""Reliability: nothing runs code from data files, damaged checkpoints and cache entries are moved aside
and redone, diverged endpoints are refused, results are strict JSON, `align` names mismatches, bad
settings and failed downloads fail early and clearly, a finished run folder is not mixed with another
config's results, and interrupted or killed runs resume where they stopped."""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
import shutil
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import read_write
from torch.utils.data import DataLoader, TensorDataset

from glmc import align
from glmc.data.cifar import cifar_splits, load_batch
from glmc.data.download import DownloadError
from glmc.data.module import DataModule
from glmc.eval.evaluator import Evaluator
from glmc.models import to_canonical
from glmc.models.build import build_model
from glmc.models.canonical import CanonicalTransformer
from glmc.pipeline import endpoints as endpoints_module
from glmc.pipeline.cache import META, WEIGHTS, CorruptEntryError, EndpointCache, config_hash
from glmc.pipeline.endpoints import cache_key, get_endpoints
from glmc.pipeline.outputs import finite_or_none, write_results
from glmc.pipeline.run import run_pipeline
from glmc.pipeline.run_folder import RunFolderGuard
from glmc.pipeline.validate import ConfigError, validate_config
from glmc.train.divergence import DivergenceError
from glmc.train.resume import EpochCheckpoint, resumable

from conftest import ROOT, ForkedRun, compose_config
from tiny_hf import tiny_gpt2, tiny_vit

NO_TRACKING = SimpleNamespace(lightning_logger=lambda name, stage: False)


# 1. data files never run code


def write_cifar10(root: Path) -> None:
    from test_data_formats import write_cifar10 as write  # the release-format fixture

    write(root)


class Planted:
    """Unpickling this would run a shell command that creates `marker`."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_planted_pickle_in_cifar_folder_is_refused_without_running(tmp_path):
    write_cifar10(tmp_path)
    marker = tmp_path / "pwned"
    target = tmp_path / "cifar-10-batches-py" / "data_batch_1"
    target.write_bytes(pickle.dumps({b"data": Planted(marker), b"labels": [0]}))
    cfg = compose_config("data=cifar10", f"data.root={tmp_path}", "data.batch_size=4")
    with pytest.raises(pickle.UnpicklingError, match="data_batch_1") as err:
        DataModule(cfg.data, seed=0).setup()
    print(f"\n  planted pickle: {err.value}")
    assert "system" in str(err.value)
    assert not marker.exists()


@pytest.mark.parametrize("protocol", [2, 5])
def test_release_format_batches_still_load(tmp_path, protocol):
    write_cifar10(tmp_path)  # numpy arrays, and labels as numpy scalars
    folder = tmp_path / "cifar-10-batches-py"
    rng = np.random.default_rng(1)
    batch = {b"batch_label": b"testing batch 1 of 1", b"data": rng.integers(0, 256, (6, 3072), dtype=np.uint8)}
    batch[b"labels"], batch[b"filenames"] = [int(i) for i in rng.integers(0, 10, 6)], [b"x.png"] * 6
    (folder / "test_batch").write_bytes(pickle.dumps(batch, protocol=protocol))
    assert np.array_equal(load_batch(folder / "test_batch")[b"data"], batch[b"data"])
    cfg = compose_config("data=cifar10", f"data.root={tmp_path}")
    train, test = cifar_splits(cfg.data)
    assert len(train) == 30 and len(test) == 6 and test[0][0].shape == (3, 32, 32)


# 2. checkpoints


def test_truncated_learned_checkpoint_is_moved_aside_and_the_rerun_starts_fresh(tmp_path):
    hf_a, hf_b = tiny_vit(seed=0, hidden=16, heads=2, mlp=32), tiny_vit(seed=1, hidden=16, heads=2, mlp=32)
    g = torch.Generator().manual_seed(0)
    data = DataLoader(
        TensorDataset(torch.randn(64, 1, 8, 8, generator=g), torch.randint(0, 10, (64,), generator=g)), batch_size=32
    )
    options = dict(
        data=data,
        run_dir=tmp_path,
        trainer={"accelerator": "cpu", "enable_progress_bar": False},
        max_steps=2,
        checkpoint_every=1,
    )
    first = align(hf_a, hf_b, "learned", **options)
    last = Path(first.diagnostics["checkpoint"])
    # an intact checkpoint resumes, loaded with weights_only=True
    assert align(hf_a, hf_b, "learned", **options).diagnostics["resumed_from"] == str(last)
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    with pytest.warns(RuntimeWarning, match=re.escape(str(last))) as record:
        again = align(hf_a, hf_b, "learned", **options)
    print(f"\n  truncated checkpoint: {record[0].message}")
    assert again.diagnostics["resumed_from"] is None and again.diagnostics["steps"] == 2
    assert len(list(last.parent.glob("last.ckpt.corrupt-*"))) == 1
    assert torch.load(last, weights_only=True)["global_step"] == 2  # written afresh


def test_empty_checkpoint_is_not_resumed(tmp_path):
    last = tmp_path / "last.ckpt"
    last.write_bytes(b"")
    with pytest.warns(RuntimeWarning, match="cannot be resumed"):
        assert resumable(last) is None
    assert not last.exists() and len(list(tmp_path.glob("last.ckpt.corrupt-*"))) == 1
    assert resumable(tmp_path / "missing.ckpt") is None


# 3. no unsafe loader left in the sources

UNSAFE = [
    (re.compile(r"pickle\.load\("), "pickle.load("),
    (re.compile(r"yaml\.load\("), "yaml.load("),
    (re.compile(r"allow_pickle\s*=\s*True"), "allow_pickle=True"),
]


def _calls(text: str, name: str):
    """The argument text of every call `name(...)`, parentheses balanced."""
    for m in re.finditer(re.escape(name) + r"\(", text):
        depth, i = 1, m.end()
        while depth and i < len(text):
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        yield m.start(), text[m.end() : i - 1]


def test_no_unsafe_loaders_in_src():
    found = []
    for path in sorted((ROOT / "src").rglob("*.py")):
        text = path.read_text()
        for pattern, label in UNSAFE:
            found += [f"{path.relative_to(ROOT)}: {label}" for _ in pattern.finditer(text)]
        for start, args in _calls(text, "torch.load"):
            if not re.search(r"weights_only\s*=\s*True", args):
                line = text.count("\n", 0, start) + 1
                found.append(f"{path.relative_to(ROOT)}:{line}: torch.load without weights_only=True")
    assert found == []


# 4. diverged endpoints are refused before caching


def _endpoints(cfg, tmp_path):
    data = DataModule(cfg.data, seed=0)
    data.setup()
    evaluator = Evaluator(data.test_dataloader(), cfg.data.task, progress=False)
    return get_endpoints(cfg, tmp_path / "run", NO_TRACKING, evaluator)


def _entries(cache_dir: Path) -> list[Path]:
    return sorted(cache_dir.glob("*/seed_*")) if cache_dir.exists() else []


def test_huge_learning_rate_stops_at_first_nonfinite_loss_and_caches_nothing(tmp_path, tiny_overrides):
    cfg = compose_config(*tiny_overrides, "train.lr=1e30", "seeds=[0,1]")
    with pytest.raises(DivergenceError, match=r"seed 0: training loss is (nan|inf|-inf) at step \d+") as err:
        _endpoints(cfg, tmp_path)
    print(f"\n  lr=1e30: {err.value}")
    assert "lower train.lr (now 1e+30)" in str(err.value)
    assert _entries(tmp_path / "endpoints") == []


def test_nonfinite_trained_weights_are_refused(tmp_path, tiny_overrides, monkeypatch):
    cfg = compose_config(*tiny_overrides, "seeds=[0,5]")

    def nan_for_seed_5(cfg, seed, run_dir, logger, checkpoint_dir=None, start_from=None):
        torch.manual_seed(seed)
        model = build_model(cfg.model)
        if seed == 5:
            with torch.no_grad():
                next(model.parameters()).fill_(float("nan"))
        return model, None  # no early stopping: no epoch kept

    monkeypatch.setattr(endpoints_module, "train_endpoint", nan_for_seed_5)
    with pytest.raises(DivergenceError, match="seed 5: trained weights are not finite") as err:
        _endpoints(cfg, tmp_path)
    print(f"\n  NaN weights: {err.value}")
    assert [p.name for p in _entries(tmp_path / "endpoints")] == ["seed_0"]


# 5. strict JSON, atomic writes


def _results(barrier: float) -> dict:
    method = {
        "barrier": barrier,
        "barrier_se": None,
        "barrier_vs_mean": float("inf"),
        "lambdas": [0.0, 0.5, 1.0],
        "test_loss": [1.0, float("nan"), 1.0],
        "test_accuracy": [0.5, 0.1, 0.5],
        "seconds": 0.1,
    }
    endpoints = [{"seed": s, "test_loss": 1.0, "test_accuracy": 0.5, "cached": False} for s in (0, 1)]
    return {"model": "m", "dataset": "d", "split": "test", "endpoints": endpoints, "methods": {"vanilla": method}}


def test_results_json_is_strict_with_nan_as_null(tmp_path):
    def refuse(name):
        raise ValueError(f"non-standard JSON constant {name}")

    write_results(_results(float("nan")), tmp_path)
    saved = json.loads((tmp_path / "results.json").read_text(), parse_constant=refuse)
    vanilla = saved["methods"]["vanilla"]
    assert vanilla["barrier"] is None and vanilla["barrier_vs_mean"] is None and vanilla["test_loss"][1] is None
    assert vanilla["test_loss"][0] == 1.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["barrier.csv", "barrier.png", "results.json"]
    assert finite_or_none({"a": (1.5, float("-inf"))}) == {"a": [1.5, None]}


def test_result_files_are_replaced_atomically(tmp_path, monkeypatch):
    write_results(_results(0.25), tmp_path)
    before = {name: (tmp_path / name).read_bytes() for name in ("results.json", "barrier.csv")}
    import glmc.pipeline.outputs as outputs

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(outputs, "plot_barrier_curves", crash)
    with pytest.raises(KeyboardInterrupt):
        write_results(_results(0.5), tmp_path)
    png = (tmp_path / "barrier.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"  # the old picture, whole
    assert json.loads((tmp_path / "results.json").read_text())["methods"]["vanilla"]["barrier"] == 0.5
    assert before["results.json"] != (tmp_path / "results.json").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["barrier.csv", "barrier.png", "results.json"]


# 6. endpoint cache integrity

from test_cache import KEY  # noqa: E402  the same small cache key


def _linear(seed: int) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(4, 3)


def _refused(cache: EndpointCache, seed: int, match: str) -> str:
    with pytest.warns(RuntimeWarning, match="moved it aside"), pytest.raises(CorruptEntryError, match=match) as err:
        cache.load(KEY, seed, torch.nn.Linear(4, 3))
    assert not cache.has(KEY, seed)
    assert len(list(cache.entry(KEY, seed).parent.glob(f"seed_{seed}.corrupt-*"))) == 1
    return str(err.value)


def test_cache_records_checksum_and_detects_swapped_weights(tmp_path):
    cache = EndpointCache(tmp_path)
    for seed in (0, 1):
        cache.save(KEY, seed, _linear(seed), {"test_loss": 1.0})
    assert len(json.loads((cache.entry(KEY, 0) / META).read_text())["sha256"]) == 64
    shutil.copy(cache.entry(KEY, 1) / WEIGHTS, cache.entry(KEY, 0) / WEIGHTS)
    message = _refused(cache, 0, "sha256")
    print(f"\n  swapped weights: {message}")
    fresh = torch.nn.Linear(4, 3)
    cache.load(KEY, 1, fresh)  # the other entry is untouched
    assert torch.equal(fresh.weight, _linear(1).weight)


def test_cache_detects_truncated_weights(tmp_path):
    cache = EndpointCache(tmp_path)
    cache.save(KEY, 0, _linear(0), {})
    weights = cache.entry(KEY, 0) / WEIGHTS
    weights.write_bytes(weights.read_bytes()[:40])
    print(f"\n  truncated weights: {_refused(cache, 0, 'sha256')}")


def test_cache_moves_aside_an_entry_without_checksum(tmp_path):
    cache = EndpointCache(tmp_path)
    cache.save(KEY, 0, _linear(0), {})
    meta_path = cache.entry(KEY, 0) / META
    meta = json.loads(meta_path.read_text())
    del meta["sha256"]  # as written before checksums: nothing vouches for the weights
    meta_path.write_text(json.dumps(meta))
    print(f"\n  entry without checksum: {_refused(cache, 0, 'records no sha256')}")


def test_cache_detects_broken_meta(tmp_path):
    cache = EndpointCache(tmp_path)
    cache.save(KEY, 0, _linear(0), {})
    meta_path = cache.entry(KEY, 0) / META
    meta_path.write_text(meta_path.read_text()[:25])
    print(f"\n  broken meta.json: {_refused(cache, 0, 'unreadable meta.json')}")


def test_cache_entry_missing_a_file_is_moved_aside(tmp_path):
    cache = EndpointCache(tmp_path)
    cache.save(KEY, 0, _linear(0), {})
    (cache.entry(KEY, 0) / WEIGHTS).unlink()
    with pytest.warns(RuntimeWarning, match=r"seed_0 is a damaged endpoint cache entry \(lacks model.safetensors\)"):
        assert not cache.has(KEY, 0)
    assert not cache.entry(KEY, 0).exists()
    assert len(list(cache.entry(KEY, 0).parent.glob("seed_0.corrupt-*"))) == 1


def test_stale_temporary_folders_are_removed_when_the_cache_opens(tmp_path):
    folder = tmp_path / "0123456789abcdef"
    stale, fresh = folder / ".tmp-seed_0-old", folder / ".tmp-seed_1-new"
    for tmp in (stale, fresh):
        tmp.mkdir(parents=True)
        (tmp / WEIGHTS).write_bytes(b"partial")
    hours_ago = time.time() - 2 * 3600
    os.utime(stale, (hours_ago, hours_ago))
    EndpointCache(tmp_path)
    assert not stale.exists() and fresh.exists()  # a fresh one may belong to a live writer
    EndpointCache(tmp_path / "not-yet-created")  # a missing root is fine


def _unverifiable_other_seed(entry: Path, other: Path) -> None:
    """seed 1's entry copied over seed 0's, with its meta.json's checksum removed (as before checksums)."""
    meta = json.loads((other / META).read_text())
    del meta["sha256"]
    shutil.copy(other / WEIGHTS, entry / WEIGHTS)
    (entry / META).write_text(json.dumps(meta))


@pytest.mark.parametrize(
    "damage",
    [lambda entry, other: shutil.copy(other / WEIGHTS, entry / WEIGHTS), _unverifiable_other_seed],
    ids=["weights of another seed", "another seed without checksum"],
)
def test_pipeline_retrains_an_entry_holding_another_seeds_weights(tmp_path, tiny_overrides, monkeypatch, damage):
    cfg = compose_config(*tiny_overrides, "seeds=[0,1]")
    trained = []

    # a seeded init stands in for training
    def fake_training(cfg, seed, run_dir, logger, checkpoint_dir=None, start_from=None):
        trained.append(seed)
        torch.manual_seed(seed)
        return build_model(cfg.model), None

    monkeypatch.setattr(endpoints_module, "train_endpoint", fake_training)
    first = _endpoints(cfg, tmp_path)
    cache = EndpointCache(tmp_path / "endpoints")
    entry = cache.entry(cache_key(cfg), 0)
    damage(entry, cache.entry(cache_key(cfg), 1))
    trained.clear()
    with pytest.warns(RuntimeWarning, match="seed_0 is a damaged endpoint cache entry"):
        second = _endpoints(cfg, tmp_path)
    assert trained == [0]  # retrained, not silently loaded
    assert [e.cached for e in second] == [False, True]
    for before, after in zip(first, second):
        assert all(torch.equal(p, q) for p, q in zip(before.model.parameters(), after.model.parameters()))
    assert cache.has(cache_key(cfg), 0)  # the retrained endpoint is cached again
    assert len(list(entry.parent.glob("seed_0.corrupt-*"))) == 1


# 7. align checks that the models fit together


@pytest.mark.parametrize(
    "model_a, model_b, message",
    [
        (tiny_vit(0, layers=2), tiny_vit(1, layers=3), "model_b has 3 layers, model_a has 2 layers"),
        (tiny_vit(0, heads=4), tiny_vit(1, heads=2), "model_b has 2 heads in layer 0, model_a has 4 heads"),
        (tiny_gpt2(0), tiny_vit(1), "model_b is a vit model, model_a is a gpt2 model"),
        (tiny_vit(0, mlp=64), tiny_vit(1, mlp=32), "model_b has MLP width 32 in layer 0, model_a has MLP width 64"),
        (tiny_vit(0, hidden=32), tiny_vit(1, hidden=16), "model_b has width 16, model_a has width 32"),
        (tiny_gpt2(0), "shorter_positions", "model_b has 12 positions, model_a has 16 positions"),
    ],
)
def test_align_names_the_first_mismatch(model_a, model_b, message):
    if model_b == "shorter_positions":
        b = to_canonical(tiny_gpt2(1))
        params = {**b.params(), "embed.pos": b.params()["embed.pos"][:12]}
        model_b = CanonicalTransformer(b.config, params)
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        align(model_a, model_b, "weight", max_iter=2)
    print(f"\n  {err.value}")


# 8. settings that cannot work fail before any data or training, naming the key


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["seeds=[0,0]"], "seeds=[0, 0]: seed 0 appears more than once"),
        (["seeds=[-1,1]"], "seeds=[-1, 1]: seed -1 is negative"),
        (["eval.num_lambdas=2"], "eval.num_lambdas=2: a barrier needs a point between the endpoints"),
        (["train.lr=0"], "train.lr=0.0: the learning rate must be positive"),
        (["train.weight_decay=-0.1"], "train.weight_decay=-0.1"),
        (["matcher.methods=[vanilla,learned_perm]", "matcher.learned.lr=-1"], "matcher.learned_perm.lr=-1.0"),
        (["train.max_epochs=-1"], "train.max_epochs=-1: train for at least 1 epoch"),
        (["data.limit_test=0"], "data.limit_test=0: keep at least 1 example"),
        (["data.limit_train=0"], "data.limit_train=0: keep at least 1 example"),
        (["data.batch_size=0"], "data.batch_size=0: use a batch size of at least 1"),
        (["eval.cache_batches_mb=-1"], "eval.cache_batches_mb=-1"),
        (["+model.widht=3"], "model.widht: not a setting of model"),
    ],
)
def test_invalid_settings_fail_before_any_work(tmp_path, tiny_overrides, overrides, message):
    cfg = compose_config(*tiny_overrides, *overrides)
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        run_pipeline(cfg, tmp_path / "run")
    print(f"\n  {' '.join(overrides)}: {err.value}")
    assert not (tmp_path / "run").exists() and not (tmp_path / "endpoints").exists()


def test_every_problem_is_listed_at_once_and_a_valid_config_passes(tiny_overrides):
    validate_config(compose_config(*tiny_overrides))
    with pytest.raises(ConfigError) as err:
        validate_config(compose_config(*tiny_overrides, "seeds=[1,1]", "train.lr=-1", "data.limit_test=0"))
    assert str(err.value).count("\n") == 3


@pytest.mark.parametrize("dataset", ["tiny_shakespeare", "cifar10"])
def test_failed_download_is_one_clear_error(tmp_path, monkeypatch, dataset):
    import urllib.error
    import urllib.request

    import torchvision.datasets.cifar

    def offline(*args, **kwargs):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(urllib.request, "urlretrieve", offline)
    monkeypatch.setattr(torchvision.datasets.cifar, "download_and_extract_archive", offline)
    cfg = compose_config(f"data={dataset}", f"data.root={tmp_path}", "data.download=true")
    with pytest.raises(DownloadError) as err:
        DataModule(cfg.data, seed=0).setup()
    print(f"\n  {dataset} offline: {err.value}")
    message = str(err.value)
    assert "Temporary failure in name resolution" in message and f"data.root={tmp_path}" in message
    assert ("raw.githubusercontent.com" if dataset == "tiny_shakespeare" else "cs.toronto.edu") in message
    assert err.value.__cause__ is None and err.value.__suppress_context__
    assert not list(tmp_path.rglob("*.part"))


# 9. a finished run folder is not silently mixed with another config's results


def test_rerun_into_a_finished_folder_needs_the_same_config_or_overwrite(tmp_path, tiny_overrides, capsys):
    run_dir = tmp_path / "run"
    base = [*tiny_overrides, "matcher.methods=[vanilla]"]
    run_pipeline(compose_config(*base), run_dir)
    saved = (run_dir / "results.json").read_bytes()
    (run_dir / "notes.txt").write_text("kept")

    changed = compose_config(*base, "train.lr=0.01")
    with pytest.raises(FileExistsError) as err:
        run_pipeline(changed, run_dir)
    print(f"\n  different config: {err.value}")
    assert str(run_dir) in str(err.value) and "train.lr: 0.003 -> 0.01" in str(err.value)
    assert "overwrite=true" in str(err.value)
    assert not EndpointCache(tmp_path / "endpoints").has(cache_key(changed), 0)  # refused before training
    assert (run_dir / "results.json").read_bytes() == saved
    # run.py refuses it before Hydra writes the run's .hydra/ files
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        full = compose(config_name="config", overrides=[*base, "train.lr=0.01"], return_hydra_config=True)
    with read_write(full):
        full.hydra.run.dir = str(run_dir)
    with pytest.raises(SystemExit):  # Hydra would turn an exception into a warning and go on
        RunFolderGuard().on_run_start(config=full, config_name="config")
    assert "train.lr: 0.003 -> 0.01" in capsys.readouterr().err

    # keys that change no result may differ
    same = compose_config(*base, "trainer.enable_progress_bar=true", "logger.project=other")
    assert all(e["cached"] for e in run_pipeline(same, run_dir)["endpoints"])

    again = run_pipeline(compose_config(*base, "eval.num_lambdas=5", "overwrite=true"), run_dir)
    assert again["methods"]["vanilla"]["lambdas"] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert json.loads((run_dir / "results.json").read_text())["methods"]["vanilla"]["lambdas"][1] == 0.25
    assert (run_dir / "notes.txt").read_text() == "kept"


def test_a_rerun_in_the_same_folder_keeps_earlier_csv_logs(tmp_path):
    from glmc.pipeline.tracking import Tracker

    cfg = compose_config("debug=fast", "logger=csv")
    loggers = []
    for loss in (1.5, 0.5):
        with Tracker(cfg, tmp_path) as tracker:
            logger = tracker.lightning_logger("learned_0-1", "match")
            logger.log_metrics({"match_loss": loss}, step=0)
            logger.save()
            loggers.append(Path(logger.log_dir))
    assert loggers == [tmp_path / "logs" / "learned_0-1", tmp_path / "logs" / "learned_0-1.2"]
    assert "1.5" in (loggers[0] / "metrics.csv").read_text() and "0.5" in (loggers[1] / "metrics.csv").read_text()


# 10. Ctrl-C says where the checkpoints are, and the same command resumes from them


def _interrupt_once(cls, when):
    """`cls.training_step` raising KeyboardInterrupt the first time `when(module, batch_idx)` holds."""
    original, fired = cls.training_step, []

    def training_step(self, batch, batch_idx):
        if not fired and when(self, batch_idx):
            fired.append(True)
            raise KeyboardInterrupt
        return original(self, batch, batch_idx)

    return training_step


def _interrupted_run(cfg, run_dir, caplog) -> str:
    handler = signal.getsignal(signal.SIGINT)
    caplog.clear()
    try:
        with caplog.at_level(logging.INFO, logger="glmc"), pytest.raises((KeyboardInterrupt, SystemExit)) as err:
            run_pipeline(cfg, run_dir)
        assert isinstance(err.value, KeyboardInterrupt) or err.value.code == 1  # Lightning exits with 1
        assert signal.getsignal(signal.SIGINT) is handler  # Ctrl-C works again
    finally:
        signal.signal(signal.SIGINT, handler)
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("interrupted")]
    return line


def test_ctrl_c_during_endpoint_training_resumes_to_the_same_endpoints(tmp_path, monkeypatch, caplog):
    from glmc.train.endpoint import EndpointModule

    def overrides(name):
        return ["debug=fast", "logger=none", "matcher.methods=[vanilla]", "train.max_epochs=3", f"cache_dir={name}"]

    cfg = compose_config(*overrides(tmp_path / "endpoints"))
    # seed 0, second epoch: the first epoch's checkpoint is written
    when = lambda module, batch_idx: module.trainer.current_epoch == 1 and batch_idx == 1
    monkeypatch.setattr(EndpointModule, "training_step", _interrupt_once(EndpointModule, when))
    line = _interrupted_run(cfg, tmp_path / "run", caplog)
    print(f"\n  Ctrl-C in endpoint training: {line}")
    last = tmp_path / "endpoints" / config_hash(cache_key(cfg)) / ".train_seed_0" / "last.ckpt"
    assert str(last) in line and "run the same command again to resume" in line
    assert torch.load(last, weights_only=True)["epoch"] == 0
    monkeypatch.undo()

    with caplog.at_level(logging.INFO, logger="glmc"):
        resumed = run_pipeline(cfg, tmp_path / "run")
    assert f"seed 0: resuming training from {last}" in caplog.text
    assert not last.parent.exists()  # removed once the endpoint is cached
    fresh = run_pipeline(compose_config(*overrides(tmp_path / "fresh")), tmp_path / "fresh_run")
    # the random state travels in the checkpoint: the resumed endpoint is the uninterrupted one, exactly
    assert [e["test_loss"] for e in resumed["endpoints"]] == [e["test_loss"] for e in fresh["endpoints"]]


def test_ctrl_c_during_learned_matching_resumes_in_the_same_folder(tmp_path, monkeypatch, caplog):
    from glmc.matching.learned_module import LearnedMatchingModule

    run_dir = tmp_path / "run"
    cfg = compose_config(
        "debug=fast",
        "logger=csv",
        f"cache_dir={tmp_path / 'endpoints'}",
        "matcher.methods=[learned]",
        "matcher.learned.max_steps=6",
        "matcher.learned.checkpoint_every=2",
    )
    when = lambda module, batch_idx: module.global_step == 3
    monkeypatch.setattr(LearnedMatchingModule, "training_step", _interrupt_once(LearnedMatchingModule, when))
    line = _interrupted_run(cfg, run_dir, caplog)
    print(f"\n  Ctrl-C in learned matching: {line}")
    (last,) = (run_dir / "learned").glob("pair_*/checkpoints/last.ckpt")
    assert line.startswith("interrupted during learned matching of seeds 0-1") and str(last) in line
    assert f"hydra.run.dir={run_dir}" in line
    metrics = run_dir / "logs" / "learned_0-1" / "metrics.csv"
    logged = metrics.read_text()
    monkeypatch.undo()

    results = run_pipeline(cfg, run_dir)
    diagnostics = results["methods"]["learned"]["pairs"][0]["diagnostics"]
    assert diagnostics["resumed_from"] == str(last) and diagnostics["steps"] == 6
    assert metrics.read_text() == logged  # the interrupted run's log is kept beside the new one
    assert (run_dir / "logs" / "learned_0-1.2" / "metrics.csv").exists()


# 11. a killed endpoint training resumes from its last epoch


def _cli(cache: Path, run: Path) -> list[str]:
    return [
        "debug=fast",
        "logger=none",
        "matcher.methods=[vanilla]",
        "train.max_epochs=4",  # killed after its second epoch's checkpoint, then resumed
        "data.limit_train=256",
        f"cache_dir={cache}",
        f"hydra.run.dir={run}",
    ]


def _endpoint_losses(run: Path) -> list[float]:
    return [e["test_loss"] for e in json.loads((run / "results.json").read_text())["endpoints"]]


def test_endpoint_training_killed_with_sigkill_resumes_to_the_same_endpoint(tmp_path, caplog, monkeypatch):
    cache, run = tmp_path / "killed", tmp_path / "run_killed"
    real = EpochCheckpoint.on_train_epoch_end

    def then_killed(self, trainer, pl_module):  # in the forked run, after its second epoch's checkpoint
        real(self, trainer, pl_module)
        if trainer.current_epoch == 1:
            os.kill(os.getpid(), signal.SIGKILL)  # no handler runs

    with monkeypatch.context() as patched:
        patched.setattr(EpochCheckpoint, "on_train_epoch_end", then_killed)
        proc = ForkedRun(_cli(cache, run), tmp_path / "first.log")  # run.py's process
        try:
            while proc.poll() is None:
                time.sleep(0.02)
        finally:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL, (tmp_path / "first.log").read_text()[-2000:]
    found = list(cache.glob("*/.train_seed_*/last.ckpt"))
    assert found, "no epoch checkpoint appeared: " + (tmp_path / "first.log").read_text()[-2000:]
    assert found[0].exists() and not (run / "results.json").exists()  # killed mid-training, nothing cached for it
    print(f"\n  killed after {found[0]} (epoch {torch.load(found[0], weights_only=True)['epoch']})")

    # the same settings again, in this process
    settings = lambda cache: [a for a in _cli(cache, run) if not a.startswith("hydra.")]  # noqa: E731
    with caplog.at_level(logging.INFO, logger="glmc"):
        run_pipeline(compose_config(*settings(cache)), run)
    assert f"resuming training from {found[0]}" in caplog.text
    assert not list(cache.glob("*/.train_seed_*"))  # removed once cached
    run_pipeline(compose_config(*settings(tmp_path / "fresh")), tmp_path / "run_fresh")  # never interrupted
    # Equal exactly: the checkpoint carries the weights, optimiser, scheduler, loop counters and every
    # random state (torch, numpy, Python, the training loader's shuffling generator). A difference would
    # mean some state is left out (e.g. a loader with workers or another sampler) or nondeterministic kernels.
    assert _endpoint_losses(run) == _endpoint_losses(tmp_path / "run_fresh")
