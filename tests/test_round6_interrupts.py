"""Run folders, signals and checkpoints: a multirun job's folder is locked as a single run's is; SIGTERM stops
the side-by-side endpoint workers at once; a full disk while learned matching writes last.ckpt is a refusal
naming it; link loops in the sweep folder and the data paths are refused by key before any work."""

from __future__ import annotations

import os

import pytest
from filelock import FileLock

from glmc.pipeline.run_folder import LOCK_NAME
from glmc.pipeline.sweep_report import FAILED_FILE

from conftest import run_script


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
