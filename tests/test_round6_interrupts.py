"""Run folders, signals and checkpoints: a multirun job's folder is locked as a single run's is; SIGTERM stops
the side-by-side endpoint workers at once; a full disk while learned matching writes last.ckpt is a refusal
naming it; link loops in the sweep folder and the data paths are refused by key before any work."""

from __future__ import annotations

import errno
import logging
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from filelock import FileLock
from stub_workers import LONG, train_until_stopped

import glmc.pipeline.endpoints as endpoints
import glmc.pipeline.side_by_side as side_by_side
from glmc.pipeline.run import run_pipeline
from glmc.pipeline.run_folder import LOCK_NAME
from glmc.pipeline.sweep_report import FAILED_FILE

from conftest import compose_config, run_script


@pytest.fixture
def quiet_hydra(monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)


# 22a. a multirun job takes the run-folder lock: a job folder another run holds is refused by name


def test_a_multirun_job_whose_folder_another_run_holds_is_refused_by_name(tmp_path, monkeypatch, capsys, quiet_hydra):
    sweep = tmp_path / "sweep"
    job = sweep / "0_logger=none,threads=-1"
    job.mkdir(parents=True)
    other = FileLock(str(job / LOCK_NAME), thread_local=False)  # another sweep's job writing there
    other.acquire(timeout=0)
    args = ("-m", "threads=-1", "logger=none", f"hydra.sweep.dir={sweep}")
    try:
        code, _, err = run_script(monkeypatch, capsys, *args)
    finally:
        other.release(force=True)
    assert code == 1, err
    assert f"is writing into the run folder {job}" in err and "(hydra.sweep.dir=...)" in err
    assert "threads=-1: use auto" not in err  # the job never ran
    assert "1 jobs failed:" in err and "Traceback" not in err
    assert not (job / FAILED_FILE).exists()  # nothing written into the folder another run holds
    # once free, the same job takes the folder (and releases it): its own refusal is recorded there
    code, _, err = run_script(monkeypatch, capsys, *args)
    assert code == 1 and "threads=-1: use auto" in err, err
    assert (job / FAILED_FILE).is_file()
    FileLock(str(job / LOCK_NAME), thread_local=False).acquire(timeout=0)


# 22d. link loops: hydra.sweep.dir


def test_a_sweep_folder_that_loops_is_refused_before_any_job(tmp_path, monkeypatch, capsys, quiet_hydra):
    os.symlink(tmp_path / "b", tmp_path / "a")
    os.symlink(tmp_path / "a", tmp_path / "b")
    sweep = tmp_path / "a" / "sweep"
    code, _, err = run_script(monkeypatch, capsys, "-m", "threads=1", "logger=none", f"hydra.sweep.dir={sweep}")
    assert code == 1, err
    assert f"the sweep folder {sweep} cannot be created: a symbolic link on this path leads back to itself" in err
    assert "(hydra.sweep.dir=...)" in err and "Traceback" not in err
    assert "job 0" not in err  # refused before any job


# 22d. link loops: data.root, data.path, data.tokenizer_path


@pytest.fixture
def loop(tmp_path):
    """A path through a -> b -> a."""
    os.symlink(tmp_path / "b", tmp_path / "a")
    os.symlink(tmp_path / "a", tmp_path / "b")
    return tmp_path / "a"


def test_a_data_root_that_loops_is_refused_on_the_command_line_before_any_work(
    tmp_path, loop, monkeypatch, capsys, quiet_hydra
):
    cache, run_dir = tmp_path / "cache", tmp_path / "run"
    args = ("debug=fast", "logger=none", f"cache_dir={cache}", f"data.root={loop}", f"hydra.run.dir={run_dir}")
    code, _, err = run_script(monkeypatch, capsys, *args)
    assert code == 1, err
    assert f"data.root={loop}: a symbolic link on this path leads back to itself (a loop)" in err
    assert "set data.root=<the folder holding the datasets>" in err and "Traceback" not in err
    assert not cache.exists()  # nothing trained or cached


@pytest.mark.parametrize(
    "key, overrides",
    [
        ("data.path={loop}/notes.txt", ["data=text_file", "model=gpt2_text"]),
        ("data.path={loop}", ["data=text_file", "model=gpt2_text"]),
        ("data.tokenizer_path={loop}", ["data=tiny_shakespeare", "model=gpt2_shakespeare"]),
        ("data.tokenizer_path={loop}", ["endpoints=pretrained", "endpoints.paths=[{loop}/m0,{loop}/m1]"]),
        ("pretrain.data.root={loop}", ["debug=fast", "pretrain.enabled=true"]),
    ],
)
def test_data_paths_that_loop_are_refused_by_key(tmp_path, loop, key, overrides):
    from glmc.pipeline.validate import ConfigError, validate_config

    setting = key.format(loop=loop)
    cfg = compose_config(*(o.format(loop=loop) for o in overrides), setting, f"cache_dir={tmp_path / 'cache'}")
    with pytest.raises(ConfigError) as refused:
        validate_config(cfg)
    message = str(refused.value)
    assert f"{setting}: a symbolic link on this path leads back to itself (a loop)" in message
    assert "no such file" not in message  # not taken for a missing file


def test_the_text_file_loader_names_a_data_path_that_loops(loop):
    from glmc.data.text_file import text_file_splits

    data = compose_config("data=text_file", f"data.path={loop}", "data.tokenizer=char").data
    with pytest.raises(FileNotFoundError, match=f"data.path={loop}: a symbolic link on this path leads back"):
        text_file_splits(data)


# 22b. SIGTERM with train.parallel_endpoints >= 2 stops the workers at once


def _started(run_dir: Path, count: int) -> list[int]:
    """The pids of the `count` workers once each has started its training (each writes its file first)."""
    deadline = time.monotonic() + LONG  # bounds a failure only: a spawned worker starts in seconds
    while len(found := sorted(run_dir.glob("started_*"))) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(found) == count, f"the workers did not start: {found}"
    return [int(p.read_text()) for p in found]


def test_sigterm_stops_the_side_by_side_workers_at_once(tmp_path, monkeypatch, caplog):
    if threading.current_thread() is not threading.main_thread():  # where run_pipeline handles SIGTERM
        pytest.skip("the SIGTERM sent below is handled in the main thread only")
    run_dir = tmp_path / "run"
    cfg = compose_config("debug=fast", "logger=none", "seeds=[0,1]", f"cache_dir={tmp_path / 'cache'}")
    cfg.train.parallel_endpoints = 2
    monkeypatch.setattr(endpoints, "train_seed", train_until_stopped)  # what each worker runs
    pids: list[int] = []
    wait_for_results = side_by_side.as_completed

    def terminated_while_training(futures):
        pids.extend(_started(run_dir, 2))
        os.kill(os.getpid(), signal.SIGTERM)  # the cluster's preemption, to this process only
        return wait_for_results(futures)

    monkeypatch.setattr(side_by_side, "as_completed", terminated_while_training)
    with caplog.at_level(logging.ERROR, logger="glmc.pipeline.run"), pytest.raises(SystemExit) as stop:
        run_pipeline(cfg, run_dir)
    assert stop.value.code == 128 + signal.SIGTERM
    assert "interrupted while training endpoints: seeds 0, 1 with no finished epoch yet" in caplog.text
    assert not list(run_dir.glob("finished_*"))  # neither worker trained on to its end
    for pid in pids:  # both ended (and were reaped) before run_pipeline returned
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


# 22c. a full disk while learned matching writes last.ckpt: a refusal naming it, not a traceback


def test_a_full_disk_under_learned_matchings_last_ckpt_is_refused_by_name(tmp_path, monkeypatch):
    import torch

    from glmc.data.module import DataModule
    from glmc.eval.evaluator import path_losses
    from glmc.matching.base import MatchContext
    from glmc.matching.learned import LearnedMatcher
    from glmc.models.convert import to_canonical
    from glmc.pipeline.refusals import is_refusal
    from glmc.train.latent_fit import fit_latents
    from glmc.train.storage import NoRoomError
    from glmc.train.trainer import trainer_factory

    from tiny_hf import tiny_vit

    cfg = compose_config("debug=fast")
    data = DataModule(cfg.data, seed=0)
    data.setup()
    a, b = (to_canonical(tiny_vit(seed=s, hidden=16, mlp=32, layers=1)) for s in (0, 1))
    save = torch.save

    def disk_full_for_last(checkpoint, path, *args, **kwargs):
        if "last.ckpt" in Path(path).name:  # last.ckpt, or the temporary file it is written through
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as a write() on a full disk: no file name
        return save(checkpoint, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", disk_full_for_last)
    matcher = LearnedMatcher(max_steps=3, checkpoint_every=2, lr=0.05, lambda_scheme="uniform")
    make = trainer_factory(cfg.trainer)
    context = MatchContext(
        data=data, trainer=make, run_dir=tmp_path / "learned", fit=fit_latents, path_loss=path_losses
    )
    with pytest.raises(NoRoomError) as refused:
        matcher.match(a, b, context)
    message = str(refused.value)
    folder = next((tmp_path / "learned").glob("pair_*/checkpoints"))
    assert (
        f"could not write the learned matching checkpoint last.ckpt into {folder}: No space left on device" in message
    )
    assert "free space on that disk, or set the run folder (hydra.run.dir) to a folder on a disk with room" in message
    assert is_refusal(refused.value)  # the command line shows the message alone, without a traceback
    assert not (folder / "last.ckpt").exists()


def test_a_full_disk_under_an_endpoint_snapshot_is_refused_by_name(tmp_path, monkeypatch):
    """train.save_steps' snapshots are refused as the endpoint's own checkpoint is (glmc.train.resume)."""
    from types import SimpleNamespace

    import torch

    import glmc.train.snapshots as snapshots
    from glmc.train.storage import NoRoomError

    def disk_full(model, filename):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(snapshots, "save_model", disk_full)
    saver = snapshots.Snapshots(tmp_path / "steps_seed_0", save_steps=2)
    saver.steps = {0, 2}
    trainer, module = SimpleNamespace(global_step=2, is_global_zero=True), SimpleNamespace(model=torch.nn.Linear(4, 4))
    with pytest.raises(NoRoomError) as refused:
        saver._save(trainer, module)
    message = str(refused.value)
    assert f"could not write the snapshot step_2.safetensors into {tmp_path / 'steps_seed_0'}: No space" in message
    assert "or set cache_dir to a folder on a disk with room" in message
    assert list((tmp_path / "steps_seed_0").iterdir()) == []  # no partial file left
