"""The run folder: locked while a run writes there, overwrite=true removes only what glmc wrote, the same
command finds its own results under symmetry=auto, and a method's residual class that contradicts an
explicit symmetry is refused (under symmetry=auto it is recorded per method)."""

import json
import os
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import read_write

from glmc.pipeline.outputs import config_as_saved
from glmc.pipeline.previous_outputs import previous_outputs, remove_previous_outputs
from glmc.pipeline.run import run_pipeline
from glmc.pipeline.run_folder import LOCK_NAME, RunFolderGuard, check_run_dir
from glmc.pipeline.validate import validate_config
from glmc.symmetry.family_defaults import resolve_run_symmetry

from conftest import CONF, compose_config, run_script


@pytest.fixture
def quiet_hydra(monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)


def _full_config(run_dir, *overrides):
    """The config Hydra hands its callbacks: with the `hydra` node, the run folder set."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        full = compose(config_name="config", overrides=list(overrides), return_hydra_config=True)
    with read_write(full):
        full.hydra.run.dir = str(run_dir)
    return full


def _finished(run_dir, cfg, methods=None):
    """A finished run of `cfg` in `run_dir`, its results.json as run_pipeline writes it (config resolved)."""
    resolve_run_symmetry(cfg, validate_config(cfg))
    run_dir.mkdir(parents=True, exist_ok=True)
    record = {"methods": methods or {}, "config": config_as_saved(cfg)}
    (run_dir / "results.json").write_text(json.dumps(record))


# 1. two runs into one folder at once: the second is refused, naming the folder and the holder


def test_a_second_run_into_a_locked_folder_is_refused_by_name(tmp_path, tiny_overrides, capsys, quiet_hydra):
    run_dir = tmp_path / "run"
    first, second = RunFolderGuard(), RunFolderGuard()
    first.on_run_start(config=_full_config(run_dir, *tiny_overrides), config_name="config")
    lock = run_dir / LOCK_NAME
    assert lock.read_text().strip() == str(os.getpid())
    other = _full_config(run_dir, *tiny_overrides, "train.lr=0.01")
    with pytest.raises(SystemExit):
        second.on_run_start(config=other, config_name="config")
    err = capsys.readouterr().err
    print(f"\n  {err.strip()}")
    assert f"another run (pid {os.getpid()}) is writing into the run folder {run_dir}" in err
    assert sorted(p.name for p in run_dir.iterdir()) == [LOCK_NAME]  # nothing of the refused run's
    first.on_run_end(config=other, config_name="config")
    second.on_run_start(config=other, config_name="config")  # the folder is free once the first ends
    second.on_run_end(config=other, config_name="config")


def test_a_folder_locked_by_another_process_is_refused_naming_its_pid(tmp_path, tiny_overrides, capsys, quiet_hydra):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    holder = (
        "import os, sys, filelock\n"
        f"lock = filelock.FileLock({str(run_dir / LOCK_NAME)!r}); lock.acquire(timeout=5)\n"
        f"open({str(run_dir / LOCK_NAME)!r}, 'w').write(str(os.getpid()))\n"
        "print('held', flush=True); sys.stdin.readline()\n"
    )
    process = subprocess.Popen([sys.executable, "-c", holder], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "held"
        with pytest.raises(SystemExit):
            RunFolderGuard().on_run_start(config=_full_config(run_dir, *tiny_overrides), config_name="config")
        assert f"another run (pid {process.pid}) is writing into the run folder {run_dir}" in capsys.readouterr().err
    finally:
        process.communicate("\n", timeout=10)
    guard = RunFolderGuard()  # the holder has ended: its lock went with it
    guard.on_run_start(config=_full_config(run_dir, *tiny_overrides), config_name="config")
    guard.on_run_end(config=None)


def test_a_refused_rerun_leaves_no_lock_file_behind(tmp_path, tiny_overrides, capsys, quiet_hydra):
    run_dir = tmp_path / "run"
    _finished(run_dir, compose_config(*tiny_overrides))
    with pytest.raises(SystemExit):
        RunFolderGuard().on_run_start(config=_full_config(run_dir, *tiny_overrides, "train.lr=0.01"), config_name="c")
    assert "train.lr: 0.003 -> 0.01" in capsys.readouterr().err
    assert sorted(p.name for p in run_dir.iterdir()) == ["results.json"]


# 2. overwrite=true removes what glmc wrote in a method folder, never the user's own files there


def test_overwrite_keeps_the_users_files_inside_method_folders(tmp_path):
    run_dir = tmp_path / "run"
    pair = {"seeds": [0, 1]}
    record = {"methods": {"weight": {"pairs": [pair]}, "learned": {"pairs": [pair]}, "vanilla": {"pairs": [pair]}}}
    written = [
        "results.json",
        "barrier.csv",
        "barrier.png",
        "weight/diagnostics_0-1.json",
        "weight/hf_0-1/model.safetensors",
        "learned/pair_0123456789ab/checkpoints/last.ckpt",
        "vanilla/hf_0-1/config.json",
    ]
    users = ["notes.txt", "weight/notes.txt", "weight/diagnostics_mine.json", "learned/pair_notes/a.txt", "logs/x"]
    for name in written + users:
        (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / name).write_text("x")
    (run_dir / "results.json").write_text(json.dumps(record))
    listed = {p.relative_to(run_dir).as_posix() for p in previous_outputs(run_dir)}
    assert listed == set(written)  # glmc's own files, never a folder holding the user's
    remove_previous_outputs(run_dir)
    left = sorted(p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*") if p.is_file())
    assert left == sorted(users)
    assert not (run_dir / "vanilla").exists()  # nothing of the user's there: the empty folder goes too


def test_overwrite_into_a_finished_run_keeps_a_note_in_a_method_folder(tmp_path, tiny_overrides):
    run_dir, weight = tmp_path / "run", ["matcher.methods=[weight]", "matcher.weight.residual=permutation"]
    first = run_pipeline(compose_config(*tiny_overrides, *weight), run_dir)
    # (item 4 on the same run: under symmetry=auto a method's own class is recorded per method)
    assert first["symmetry"]["residual"] == "orthogonal" and first["symmetry"]["methods"] == {"weight": "permutation"}
    assert json.loads((run_dir / "results.json").read_text())["symmetry"]["methods"] == {"weight": "permutation"}
    assert (run_dir / "weight" / "diagnostics_0-1.json").is_file()
    (run_dir / "weight" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="your own files there are kept"):
        check_run_dir(compose_config(*tiny_overrides, *weight, "eval.num_lambdas=5"), run_dir)
    run_pipeline(compose_config(*tiny_overrides, *weight, "eval.num_lambdas=5", "overwrite=true"), run_dir)
    assert (run_dir / "weight" / "notes.txt").read_text() == "mine"
    assert json.loads((run_dir / "results.json").read_text())["methods"]["weight"]["lambdas"][1] == 0.25


# 3. the same command into its own finished folder finds its results (symmetry=auto compared resolved)


def test_the_same_command_finds_its_own_results_under_symmetry_auto(tmp_path, tiny_overrides, capsys, quiet_hydra):
    run_dir = tmp_path / "run"
    _finished(run_dir, compose_config(*tiny_overrides))
    saved = json.loads((run_dir / "results.json").read_text())["config"]
    assert saved["symmetry"]["residual"] == "orthogonal" and saved["matcher"]["weight"]["residual"] == "orthogonal"
    guard = RunFolderGuard()
    guard.on_run_start(config=_full_config(run_dir, *tiny_overrides), config_name="config")  # not refused
    guard.on_run_end(config=None)
    # an explicit symmetry=orthogonal is what auto resolved to: the same numbers, not refused either
    guard.on_run_start(config=_full_config(run_dir, *tiny_overrides, "symmetry=orthogonal"), config_name="config")
    guard.on_run_end(config=None)
    with pytest.raises(SystemExit):  # another class is another config
        RunFolderGuard().on_run_start(
            config=_full_config(run_dir, *tiny_overrides, "symmetry=permutation"), config_name="c"
        )
    assert 'symmetry.residual: "orthogonal" -> "permutation"' in capsys.readouterr().err


# 4. a method's residual class against an explicit symmetry: refused; under symmetry=auto: recorded


def test_a_method_residual_contradicting_an_explicit_symmetry_is_refused(
    tmp_path, tiny_overrides, monkeypatch, capsys, quiet_hydra
):
    contradiction = ["symmetry=permutation", "matcher.weight.residual=orthogonal"]
    with pytest.raises(ValueError) as err:
        resolve_run_symmetry(compose_config(*contradiction), None)
    print(f"\n  {err.value}")
    assert "matcher.weight.residual=orthogonal contradicts symmetry.residual=permutation" in str(err.value)
    code, _, stderr = run_script(
        monkeypatch, capsys, *tiny_overrides, *contradiction, f"hydra.run.dir={tmp_path / 'run'}"
    )
    assert code == 1 and "matcher.weight.residual=orthogonal contradicts symmetry.residual=permutation" in stderr
    assert not (tmp_path / "run").exists()  # refused before Hydra writes .hydra/ there
    # a method of its own class (weight_perm) and the same class are no contradiction
    agreed = compose_config("symmetry=orthogonal", "matcher.weight.residual=orthogonal")
    assert resolve_run_symmetry(agreed, validate_config(agreed))["methods"] == {"weight_perm": "permutation"}


def test_a_methods_own_residual_class_is_recorded_per_method_under_auto():
    cfg = compose_config("matcher.weight.residual=permutation", "matcher.methods=[weight,learned]")
    record = resolve_run_symmetry(cfg, validate_config(cfg))
    assert record == {
        "residual": "orthogonal",
        "source": "family default",
        "family": "vit",
        "blocks": {"attention": "full", "mlp": "plain", "head_spaces": ["qk", "vo"]},
        "methods": {"weight": "permutation"},
    }
    assert cfg.matcher.weight.residual == "permutation" and cfg.matcher.learned.residual == "orthogonal"
