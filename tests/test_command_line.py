"""run.py's refusals: glmc's message alone on stderr and exit status 1 (the traceback with
HYDRA_FULL_ERROR=1); a refused run leaves its folder as it was; result files get the user's file mode
and a full disk is reported by what was and was not written."""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

import pytest

from glmc.pipeline import outputs
from glmc.pipeline.outputs import ResultsNotWritten, write_results
from glmc.pipeline.pairing import seed_pairs
from glmc.pipeline.refusals import is_refusal, unquoted_override_problem
from glmc.pipeline.run_folder import check_links
from glmc.safe_files import atomic_write_text

from conftest import run_script


def _run(monkeypatch, capsys, *overrides: str) -> tuple[int, str]:
    code, _, err = run_script(monkeypatch, capsys, *overrides)
    return code, err


@pytest.fixture
def quiet_hydra(monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)


def test_a_refused_setting_prints_the_message_alone(tmp_path, tiny_overrides, monkeypatch, capsys, quiet_hydra):
    code, err = _run(monkeypatch, capsys, *tiny_overrides, "seeds=[3,3]", f"hydra.run.dir={tmp_path / 'run'}")
    assert code == 1
    assert "Traceback" not in err
    assert "Error: invalid config" in err and "seeds=[3, 3]" in err


def test_hydra_full_error_keeps_the_traceback(tmp_path, tiny_overrides, monkeypatch, capsys):
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    code, err = _run(monkeypatch, capsys, *tiny_overrides, "seeds=[3,3]", f"hydra.run.dir={tmp_path / 'run'}")
    assert code == 1
    assert "Traceback" in err and "seeds=[3, 3]" in err


def test_a_refused_rerun_leaves_the_folder_as_it_was(tmp_path, tiny_overrides, monkeypatch, capsys, quiet_hydra):
    run_dir = tmp_path / "finished"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / "results.json").write_text(json.dumps({"config": {"seeds": [5, 6]}}))
    kept = {"config.yaml": "seeds: [5, 6]\n", "overrides.yaml": "- seeds=[5,6]\n"}
    for name, text in kept.items():
        (run_dir / ".hydra" / name).write_text(text)
    code, err = _run(monkeypatch, capsys, *tiny_overrides, f"hydra.run.dir={run_dir}")
    assert code == 1 and "Traceback" not in err
    assert "already holds the results of a different config" in err and "overwrite=true" in err
    assert {p.name: p.read_text() for p in (run_dir / ".hydra").iterdir()} == kept
    assert sorted(p.name for p in run_dir.iterdir()) == [".hydra", "results.json"]  # no run.log either


def test_a_run_folder_that_is_a_file_is_refused_by_name(tmp_path, tiny_overrides, monkeypatch, capsys, quiet_hydra):
    file = tmp_path / "a_file"
    file.write_text("not a folder")
    code, err = _run(monkeypatch, capsys, *tiny_overrides, f"hydra.run.dir={file}")
    assert code == 1 and "Traceback" not in err and "UserWarning" not in err
    assert f"{file} is not a folder" in err
    assert file.read_text() == "not a folder"


def test_an_unquoted_path_with_accents_gets_the_quoted_form():
    problem = unquoted_override_problem("hydra.run.dir=/tmp/résumé")
    assert problem is not None and "\"hydra.run.dir='/tmp/résumé'\"" in problem and "é" in problem
    assert unquoted_override_problem("hydra.run.dir='/tmp/résumé'") is None  # quoted: Hydra reads it
    assert unquoted_override_problem("seeds=[0,1]") is None
    assert unquoted_override_problem("--multirun") is None


def test_only_glmc_errors_are_refusals():
    with pytest.raises(ValueError) as own:
        seed_pairs([0], "disjoint")  # raised by glmc to say what to change
    assert is_refusal(own.value)
    with pytest.raises(ValueError) as foreign:
        json.loads("{")  # raised inside the json package: a fault to show with its traceback
    assert not is_refusal(foreign.value)
    with pytest.raises(KeyError) as bug:
        {}["missing"]
    assert not is_refusal(bug.value)


def test_a_link_out_of_the_run_folder_is_refused(tmp_path):
    run_dir, outside = tmp_path / "run", tmp_path / "elsewhere"
    (run_dir / "learned").mkdir(parents=True)
    outside.mkdir()
    (run_dir / "logs").symlink_to(run_dir / "learned")  # inside: harmless
    check_links(run_dir)
    (run_dir / "weight").symlink_to(outside, target_is_directory=True)
    with pytest.raises(FileExistsError, match="weight is a symbolic link to .*elsewhere, outside the run folder"):
        check_links(run_dir)


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_result_files_get_the_users_file_mode(tmp_path, mask):
    old = os.umask(mask)
    try:
        path = atomic_write_text(tmp_path / "results.json", "{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask


def _results() -> dict:
    method = {"lambdas": [0.0, 0.5, 1.0], "test_loss": [1.0, 1.5, 1.0], "test_accuracy": [0.9, 0.5, 0.9]}
    return {"model": "vit", "dataset": "digits", "endpoints": [{"seed": 0}, {"seed": 1}], "methods": {"m": method}}


def test_a_full_disk_says_what_was_written_and_what_was_not(tmp_path, monkeypatch):
    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(outputs, "plot_barrier_curves", full_disk)
    with pytest.raises(ResultsNotWritten) as err:
        write_results(_results(), tmp_path)
    message = str(err.value)
    assert "wrote results.json, barrier.csv" in message
    assert f"could not write barrier.png ({os.strerror(errno.ENOSPC)})" in message
    assert is_refusal(err.value)
    assert json.loads((tmp_path / "results.json").read_text())["methods"]["m"]["test_loss"] == [1.0, 1.5, 1.0]
    assert not (tmp_path / "barrier.png").exists()
    assert not list(Path(tmp_path).glob(".barrier.png.tmp-*"))  # no temporary file left behind
