"""The run folder and the run's process: a `hydra.` override naming a class Hydra would build is refused
before Hydra builds it; overwrite=true removes only the files glmc wrote, inside the run folder, whatever
the replaced results.json says; matplotlib keeps its files in the cache folder, not under $HOME; W&B
online without a key is refused before any work."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from glmc.pipeline.hydra_targets import hydra_override_problems

from conftest import ROOT


def _run_py(*args: str, env: dict[str, str] | None = None, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
        cwd=cwd or ROOT,
        timeout=300,
    )


# 3. hydra.* overrides whose `_target_` Hydra would build are refused before Hydra builds them


def test_a_hydra_callback_of_another_class_is_refused_before_hydra_builds_it(tmp_path):
    source, copy, written = tmp_path / "secret.txt", tmp_path / "copied.txt", tmp_path / "written.txt"
    source.write_text("secret")
    evil = f"+hydra.callbacks.evil={{_target_: shutil.copy, src: {source}, dst: {copy}}}"
    write = [f"+hydra.callbacks.w={{_target_: pathlib.Path.write_text, _args_: [{written}, x]}}"]
    proc = _run_py(evil, *write, "debug=fast", "logger=none", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert not copy.exists() and not written.exists()  # Hydra built nothing
    assert f"the override {evil} sets hydra.callbacks.evil._target_=shutil.copy" in proc.stderr
    assert "hydra.callbacks.w._target_=pathlib.Path.write_text" in proc.stderr
    assert "glmc.pipeline.run_folder.RunFolderGuard" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()  # refused before Hydra made the run folder


@pytest.mark.parametrize(
    "override, named",
    [
        ("+hydra={callbacks: {e: {_target_: os.system}}}", "hydra.callbacks.e._target_=os.system"),
        ("hydra.launcher._target_=os.system", "hydra.launcher._target_=os.system"),
        ("hydra.sweeper._target_=builtins.exec", "hydra.sweeper._target_=builtins.exec"),
        (  # one of glmc's callbacks, with another class inside that instantiate would build first
            "+hydra.callbacks.x={_target_: glmc.pipeline.run_folder.RunFolderGuard, a: {_target_: os.system}}",
            "hydra.callbacks.x.a._target_=os.system",
        ),
        ("+hydra.callbacks.e=${trainer}", "hydra.callbacks.e=${trainer}"),  # a node of the config, built
        ("+hydra.job_logging.handlers.e={class: shutil.copy, src: a, dst: b}", "job_logging.handlers.e.class=shutil"),
        ("+hydra.callbacks.e._target_=glmc.pipeline.run_folder.RunFolderGuard,os.system", "_target_=os.system"),
    ],
)
def test_every_hydra_target_outside_the_allow_list_is_named(override, named):
    problems = hydra_override_problems(["-m", override, "seeds=[0,1]"])
    assert len(problems) == 1 and named in problems[0] and override in problems[0]


def test_hydras_own_plugins_glmcs_callbacks_and_group_picks_pass():
    allowed = [
        "-m",
        "hydra/launcher=local_grid",
        "hydra.launcher._target_=hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher",
        "hydra.sweeper._target_=hydra._internal.core_plugins.basic_sweeper.BasicSweeper",
        "hydra.callbacks.run_folder_guard._target_=glmc.pipeline.sweep_report.SweepReport",
        "~hydra.callbacks.sweep_report",
        "hydra.run.dir=outputs/${experiment}",
        "hydra.job_logging.handlers.file.class=logging.handlers.RotatingFileHandler",
        "+hydra.callbacks.guard={_target_: glmc.pipeline.run_folder.RunFolderGuard}",
        "model=vit_digits",
    ]
    assert hydra_override_problems(allowed) == []
