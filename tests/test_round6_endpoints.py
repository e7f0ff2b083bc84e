"""Endpoint modes: settings a mode does not read are refused before any work, endpoints=spawn needs steps
and records what its children vary, and summarize.py and the interrupted-run message know spawn runs."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from glmc.pipeline.validate import ConfigError, validate_config
from glmc.train.resume import EpochCheckpoint

from conftest import ForkedRun, compose_config, load_script, run_script

SPAWN = ["endpoints=spawn", "seeds=[1,2]", "matcher.methods=[vanilla]", "data.limit_train=128"]


def _problems(*overrides: str) -> str:
    """The check's message for a config composed as the tests do (no command line: every value counts)."""
    try:
        validate_config(compose_config("debug=fast", *overrides))
    except ConfigError as err:
        return str(err)
    return ""


def test_spawn_without_steps_is_refused_before_any_work(tmp_path, monkeypatch, capsys):
    run, cache = tmp_path / "run", tmp_path / "cache"
    args = ["debug=fast", "logger=none", *SPAWN, "endpoints.steps=[]", f"cache_dir={cache}", f"hydra.run.dir={run}"]
    code, _, err = run_script(monkeypatch, capsys, *args)
    assert code == 1
    assert "endpoints.steps=[]: endpoints=spawn starts its children" in err and "give at least one" in err
    assert not (run / "results.json").exists() and not cache.exists()  # nothing trained, nothing written


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["endpoints.steps=[0,5]"], "endpoints.steps=[0, 5]: not read with endpoints=trained; add endpoints=spawn"),
        (["endpoints=finetuned", "endpoints.steps=[3]"], "endpoints.steps=[3]: not read with endpoints=finetuned"),
        (["endpoints.tasks=[{subset:0}]"], "endpoints.tasks=[{'subset': 0}]: not read with endpoints=trained"),
        (
            [*SPAWN, "endpoint_models=[{},{}]"],
            "endpoint_models=[{}, {}]: not read with endpoints=spawn; the children share their parent's model",
        ),
        (["endpoints=pretrained", "seed_vary=init"], "seed_vary=init: not read with endpoints=pretrained"),
        ([*SPAWN, "seed_vary=init"], "seed_vary=init: with endpoints=spawn every child starts from the parent's"),
    ],
)
def test_a_setting_the_mode_does_not_read_is_refused_by_key_and_mode(overrides, expected):
    assert expected in _problems(*overrides)


@pytest.mark.parametrize(
    "overrides",
    [
        [],  # endpoints=trained with every default, steps=[0] included
        [*SPAWN],  # spawn.yaml's steps: [0]
        [*SPAWN, "seed_vary=data"],  # what a spawn run's children vary
        ["endpoints=finetuned"],  # finetuned.yaml's tasks: []
    ],
)
def test_defaults_and_what_a_mode_reads_are_not_refused(overrides):
    problems = _problems(*overrides)
    for key in ("endpoints.steps", "endpoints.tasks", "endpoint_models", "seed_vary"):
        assert f"\n  {key}=" not in problems


def test_a_value_an_experiment_file_set_is_not_refused_but_the_command_lines_is(tmp_path, monkeypatch, capsys):
    """experiment=spawn_text sets endpoints.steps; its documented endpoints=trained comparison runs as it is.
    num_lambdas=2 stops both runs at the check, so nothing trains."""
    args = ["experiment=spawn_text", "endpoints=trained", "logger=none", "eval.num_lambdas=2"]
    args += [f"cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={tmp_path / 'run'}"]
    code, _, err = run_script(monkeypatch, capsys, *args)
    assert code == 1 and "eval.num_lambdas=2" in err and "endpoints.steps" not in err
    code, _, err = run_script(monkeypatch, capsys, *args, "endpoints.steps=[0,8]")
    assert code == 1 and "endpoints.steps=[0, 8]: not read with endpoints=trained" in err


@pytest.fixture(scope="module")
def spawn_run(tmp_path_factory):
    """A real spawn run's folder (two steps, two children each, vanilla only: seconds)."""
    folder = tmp_path_factory.mktemp("spawn_run")
    args = ["debug=fast", "logger=none", *SPAWN, "endpoints.steps=[0,2]", "seed_vary=data"]
    args += [f"cache_dir={folder / 'cache'}", f"hydra.run.dir={folder / 'runs' / 'a'}"]
    with pytest.MonkeyPatch.context() as patch:
        code, _, err = run_script(patch, _NoCapture(), *args)
    assert code == 0, err
    return folder


class _NoCapture:
    """run_script's capsys where a module fixture has none: the output stays on the terminal."""

    def readouterr(self):
        return type("Captured", (), {"out": "", "err": ""})()


def test_a_spawn_run_records_that_its_children_differ_by_data_order(spawn_run):
    results = json.loads((spawn_run / "runs" / "a" / "results.json").read_text())
    assert results["spawn"]["seed_vary"] == "data"
    assert {(e["init_seed"], e["data_seed"]) for e in results["endpoints"]} == {(0, 1), (0, 2)}


def _summarize(monkeypatch, capsys, folder) -> str:
    monkeypatch.setattr(sys, "argv", ["summarize.py", str(folder)])
    load_script("experiments/summarize.py").main()
    return capsys.readouterr().out


def test_summarize_shows_a_spawn_run_per_step_and_names_a_cut_short_results_file(
    spawn_run, tmp_path, monkeypatch, capsys
):
    spawned = (spawn_run / "runs" / "a" / "results.json").read_text()
    for name, text in (("a", spawned), ("b", spawned[: len(spawned) // 2])):  # b: cut short while written
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(text)
    pair = {"seeds": [0, 1], "barrier": 0.5, "barrier_vs_mean": 0.5, "lambdas": [0.0, 1.0]}
    pair.update(test_loss=[0.1, 0.1], test_accuracy=[0.9, 0.9])
    trained = {"experiment": "e", "model": "m", "dataset": "d", "methods": {"vanilla": {"pairs": [pair]}}}
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "results.json").write_text(json.dumps(trained))
    printed = _summarize(monkeypatch, capsys, tmp_path)
    assert f"spawn run {tmp_path / 'a' / 'results.json'}:" in printed
    assert any(line.split()[:1] == ["2"] for line in printed.splitlines())  # the row of spawn step 2
    assert f"- {tmp_path / 'b' / 'results.json'}: cannot be read (" in printed and "cut short" in printed
    assert "| e | m | d | vanilla | - | 1 | 0.500 |" in printed  # the other runs are still summarized
    assert (tmp_path / "summary.png").exists() and "cannot be read" in (tmp_path / "summary.md").read_text()


def test_summarize_a_folder_of_spawn_runs_only_writes_the_table_and_no_figure(spawn_run, monkeypatch, capsys):
    printed = _summarize(monkeypatch, capsys, spawn_run / "runs")
    assert "children spawned from the parent (seed 0) at step k of 4" in printed
    assert "no seed pairs: no figure" in printed and not (spawn_run / "runs" / "summary.png").exists()


def _terminated_after_first_epoch(tmp_path, monkeypatch, seed: int, steps: str) -> tuple[Path, str, int]:
    """A spawn run (parent: seed 0, children: seeds 1 and 2) sent SIGTERM right after the first epoch of the
    training of `seed`: (that training's checkpoint, the interrupted line, the exit status)."""
    real = EpochCheckpoint.on_train_epoch_end

    def then_terminated(self, trainer, pl_module):  # runs in the forked run: a real signal, at a known point
        real(self, trainer, pl_module)
        if self.path.parent.name == f".train_seed_{seed}":
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(EpochCheckpoint, "on_train_epoch_end", then_terminated)
    cache, log = tmp_path / "cache", tmp_path / "run.log"
    args = ["debug=fast", "logger=none", *SPAWN, "seed_fixed=0", f"endpoints.steps={steps}"]  # 2 epochs each
    run = ForkedRun([*args, f"cache_dir={cache}", f"hydra.run.dir={tmp_path / 'run'}"], log)
    try:
        while run.poll() is None:
            time.sleep(0.05)
    finally:
        run.kill()
    [checkpoint] = cache.glob(f"*/.train_seed_{seed}/last.ckpt")
    (line,) = [x for x in log.read_text().splitlines() if "interrupted while training endpoints" in x]
    return checkpoint, line, run.returncode


def test_sigterm_during_a_spawn_childs_training_names_its_checkpoint(tmp_path, monkeypatch):
    checkpoint, line, code = _terminated_after_first_epoch(tmp_path, monkeypatch, 1, "[0]")
    assert f"the last finished epoch of step 0's child of seed 1 checkpointed in {checkpoint}" in line
    assert f"the parent's (seed 0) states at steps [0] cached in {tmp_path / 'cache'}" in line
    folder = checkpoint.parent.parent  # the children of step 0 share it
    assert f"step 0's children of seed 2 with no finished epoch yet (checkpoints go to {folder}/" in line
    assert code == 128 + signal.SIGTERM


def test_sigterm_during_the_spawn_parents_training_names_its_checkpoint(tmp_path, monkeypatch):
    checkpoint, line, code = _terminated_after_first_epoch(tmp_path, monkeypatch, 0, "[0,4]")  # 4: its last step
    assert f"the last finished epoch of the parent (seed 0) checkpointed in {checkpoint}" in line
    assert "child" not in line and code == 128 + signal.SIGTERM
