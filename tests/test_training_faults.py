"""Faults around endpoint training: workers that outlive a killed run, a damaged training checkpoint, a
full disk under the cache, what an interrupted run says it kept, and the file modes of the cache."""

from __future__ import annotations

import errno
import logging
import os
import queue
import signal
import stat
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors import SafetensorError

import glmc.pipeline.cache as cache_module
import glmc.pipeline.side_by_side as side_by_side
from glmc.pipeline.cache import EndpointCache, config_hash
from glmc.pipeline.endpoints import cache_key, train_endpoint
from glmc.pipeline.refusals import exit_if_refused, is_refusal
from glmc.pipeline.run import interrupted_message
from glmc.train.resume import EpochCheckpoint, resumable
from glmc.train.storage import NoRoomError

from conftest import ROOT, compose_config

FAST = ("debug=fast", "logger=none", "train.max_epochs=1", "data.limit_train=64")

# 5. workers end with the run that started them

# The parent starts one worker as side_by_side does (a spawned process pool whose initializer is
# end_with_parent), prints the worker's pid and waits. parent_watch is imported as a file of its own, so
# that neither process pays for importing torch.
PARENT = """
import os, sys, time
from concurrent.futures import ProcessPoolExecutor
import multiprocessing
sys.path.insert(0, {folder!r})
import parent_watch
pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                           initializer=parent_watch.end_with_parent, initargs=(os.getpid(), 0.05, {kernel}))
print(pool.submit(os.getpid).result(), flush=True)
pool.submit(time.sleep, 120)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    """Whether `pid` still runs (a zombie that nobody has reaped yet has ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


@pytest.mark.parametrize("kernel", [True, False], ids=["parent_death_signal", "watch_thread"])
def test_a_worker_ends_when_its_parent_is_killed(kernel):
    script = PARENT.format(folder=str(ROOT / "src" / "glmc" / "train"), kernel=kernel)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    worker = None
    try:
        worker = int(parent.stdout.readline())
        assert _alive(worker)
        parent.send_signal(signal.SIGKILL)  # no handler runs: the run's process just vanishes
        parent.wait(timeout=60)
        deadline = time.monotonic() + 60  # bounds a failure only: the worker ends within its 0.05 s watch
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _alive(worker), "the worker outlived its killed parent"
    finally:
        parent.kill()
        parent.wait()
        if worker is not None and _alive(worker):
            os.kill(worker, signal.SIGKILL)


def test_side_by_side_workers_are_set_to_end_with_the_run(monkeypatch):
    seen = []
    monkeypatch.setattr(side_by_side, "end_with_parent", seen.append)
    root, threads = logging.getLogger(), torch.get_num_threads()
    handlers, level = root.handlers[:], root.level
    try:
        side_by_side._start_worker(queue.Queue(), threads, level, 4321)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    assert seen == [4321]


# 10. a damaged last.ckpt is moved aside, named, and training starts from scratch


def _damaged_checkpoint(path: Path, pickled: bytes) -> None:
    """A file laid out as torch.save's zip archive whose pickle is `pickled`."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", pickled)
        archive.writestr("archive/version", b"3\n")
        archive.writestr("archive/byteorder", b"little")


@pytest.mark.parametrize(
    "pickled, error",
    [
        (b"\x80\x02t.", "IndexError: pop from empty list"),  # a tuple without its mark: the unpickler's own error
        (b"\x80\x02}.", "ValueError: not a training checkpoint"),  # loads, but is no Lightning checkpoint
    ],
    ids=["unpickler_error", "no_state_dict"],
)
def test_a_damaged_checkpoint_is_moved_aside_and_named(tmp_path, pickled, error):
    last = tmp_path / "last.ckpt"
    _damaged_checkpoint(last, pickled)
    with pytest.warns(RuntimeWarning, match="cannot be resumed from") as record:
        assert resumable(last) is None
    message = str(record[0].message)
    assert str(last) in message and error in message
    assert not last.exists() and len(list(tmp_path.glob("last.ckpt.corrupt-*"))) == 1


def test_training_restarts_from_scratch_over_a_damaged_checkpoint(tmp_path):
    cfg = compose_config(*FAST, f"cache_dir={tmp_path / 'cache'}")
    folder = tmp_path / ".train_seed_0"
    folder.mkdir()
    _damaged_checkpoint(folder / "last.ckpt", b"\x80\x02t.")
    with pytest.warns(RuntimeWarning, match="last.ckpt cannot be resumed from"):
        model, _ = train_endpoint(cfg, 0, tmp_path / "run", logger=False, checkpoint_dir=folder)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert torch.load(folder / "last.ckpt", weights_only=True)["epoch"] == 0  # written afresh by this training
    assert len(list(folder.glob("last.ckpt.corrupt-*"))) == 1


# 11. a full disk: the partial file removed, one message naming the folder and the room needed


def _full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class _Trainer(SimpleNamespace):
    """What EpochCheckpoint reads of a Trainer; its save writes `written` bytes into a file it creates
    0600 (as mkstemp does), then calls `fail`."""

    def __init__(self, fail=None, written=b"partial"):
        super().__init__(should_stop=False, train_dataloader=None, is_global_zero=True)
        self.fail, self.written = fail, written

    def save_checkpoint(self, path, weights_only=False):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(self.written)
        if self.fail:
            self.fail()


def test_a_full_disk_while_checkpointing_is_one_refusal(tmp_path, capsys):
    last = tmp_path / ".train_seed_0" / "last.ckpt"
    callback = EpochCheckpoint(last)
    callback.on_train_epoch_end(_Trainer(), torch.nn.Linear(4, 3))  # an earlier epoch's checkpoint
    with pytest.raises(NoRoomError) as caught:
        callback.on_train_epoch_end(_Trainer(_full_disk), torch.nn.Linear(4, 3))
    message = str(caught.value)
    assert message.startswith(f"could not write the training checkpoint into {last.parent}: No space left on device")
    assert "about 7 bytes needed" in message and "free there" in message and "set cache_dir" in message
    assert not last.with_name("last.ckpt.tmp").exists()  # the partial file is removed
    assert last.read_bytes() == b"partial"  # the previous checkpoint stays the one to resume from
    assert is_refusal(caught.value)
    with pytest.raises(SystemExit) as stop:
        exit_if_refused(caught.value)
    assert stop.value.code == 1 and capsys.readouterr().err == f"Error: {message}\n"


def test_other_write_errors_are_not_called_a_full_disk(tmp_path):
    def denied():
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    with pytest.raises(PermissionError):
        EpochCheckpoint(tmp_path / "last.ckpt").on_train_epoch_end(_Trainer(denied), torch.nn.Linear(4, 3))
    assert not (tmp_path / "last.ckpt.tmp").exists()


def _safetensors_full(model, path):
    Path(path).write_bytes(b"partial")
    raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")


def _os_full(model, path):
    Path(path).write_bytes(b"partial")
    _full_disk()


@pytest.mark.parametrize("save", [_os_full, _safetensors_full], ids=["oserror", "safetensors"])
def test_a_full_disk_while_caching_is_one_refusal(tmp_path, monkeypatch, save):
    cache, key = EndpointCache(tmp_path), {"model": "tiny"}
    monkeypatch.setattr(cache_module, "save_model", save)
    with pytest.raises(NoRoomError) as caught:
        cache.save(key, 3, torch.nn.Linear(4, 3), {"test_loss": 1.0})
    message = str(caught.value)
    folder = tmp_path / config_hash(key)
    assert message.startswith(f"could not write the endpoint of seed 3 into {folder}: No space left on device")
    assert "about 60 bytes needed" in message and is_refusal(caught.value)  # 15 float32 weights
    assert list(folder.iterdir()) == []  # neither an entry nor its temporary folder


def test_a_full_disk_during_training_stops_it_with_the_refusal(tmp_path, monkeypatch):
    import lightning

    cfg = compose_config(*FAST, f"cache_dir={tmp_path / 'cache'}")
    monkeypatch.setattr(lightning.Trainer, "save_checkpoint", lambda *args, **kwargs: _full_disk())
    folder = tmp_path / ".train_seed_0"
    with pytest.raises(NoRoomError, match=f"could not write the training checkpoint into {folder}") as caught:
        train_endpoint(cfg, 0, tmp_path / "run", logger=False, checkpoint_dir=folder)
    assert is_refusal(caught.value) and list(folder.iterdir()) == []


# 15. an interrupted run says what endpoint training kept


def test_the_interrupt_message_names_cached_seeds_and_checkpoints(tmp_path):
    cfg = compose_config("debug=fast", "logger=none", "seeds=[0,1,2,3]", f"cache_dir={tmp_path}")
    key = cache_key(cfg)
    cache = EndpointCache(tmp_path)
    for seed in (0, 1):
        cache.save(key, seed, torch.nn.Linear(4, 3), {"test_loss": 1.0})
    last = cache.training_dir(key, 2) / "last.ckpt"
    last.parent.mkdir()
    last.write_bytes(b"")
    line = interrupted_message(cfg, tmp_path / "run", {"name": "endpoints"})
    folder = tmp_path / config_hash(key)
    assert f"seeds 0, 1 cached in {folder}" in line
    assert f"the last finished epoch of seed 2 checkpointed in {last}" in line
    assert f"seed 3 with no finished epoch yet (checkpoints go to {folder}/.train_seed_<n>/last.ckpt)" in line
    assert line.endswith("run the same command again to resume (cached endpoints are reused)")
    for seed in (2, 3):
        cache.save(key, seed, torch.nn.Linear(4, 3), {"test_loss": 1.0})
    line = interrupted_message(cfg, tmp_path / "run", {"name": "endpoints"})
    assert f"interrupted while training endpoints: seeds 0, 1, 2, 3 cached in {folder};" in line
    assert "no finished epoch" not in line


# 19. what the cache writes takes the user's file mode


@pytest.mark.parametrize("mask", [0o022, 0o027], ids=["umask_022", "umask_027"])
def test_cache_files_follow_the_umask(tmp_path, mask):
    old = os.umask(mask)
    try:
        cache, key = EndpointCache(tmp_path), {"model": "tiny"}
        entry = cache.save(key, 0, torch.nn.Linear(4, 3), {"test_loss": 1.0})
        last = cache.training_dir(key, 0) / "last.ckpt"
        EpochCheckpoint(last).on_train_epoch_end(_Trainer(), torch.nn.Linear(4, 3))
        with cache.lock(key, 0):
            pass
        lock = cache.lock_path(key, 0)
    finally:
        os.umask(old)
    mode = lambda path: stat.S_IMODE(path.stat().st_mode)  # noqa: E731
    folders = [entry.parent, entry, last.parent]
    files = [entry / "model.safetensors", entry / "meta.json", last, lock]
    assert {str(p): oct(mode(p)) for p in folders} == {str(p): oct(0o777 & ~mask) for p in folders}
    assert {str(p): oct(mode(p)) for p in files} == {str(p): oct(0o666 & ~mask) for p in files}
