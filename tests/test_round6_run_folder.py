"""The run folder and the run's process: a `hydra.` override naming a class Hydra would build is refused
before Hydra builds it; overwrite=true removes only the files glmc wrote, inside the run folder, whatever
the replaced results.json says; matplotlib keeps its files in the cache folder, not under $HOME; W&B
online without a key is refused before any work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from glmc.pipeline.hydra_targets import hydra_override_problems
from glmc.pipeline.matplotlib_dir import use_cache_for_matplotlib
from glmc.pipeline.model_card import model_card
from glmc.pipeline.previous_outputs import previous_outputs, remove_previous_outputs
from glmc.pipeline.run import run_pipeline
from glmc.pipeline.validate import ConfigError
from glmc.pipeline.wandb_login import wandb_login_problems

from conftest import ROOT, compose_config, run_script


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


def test_a_hydra_callback_of_another_class_is_refused_before_hydra_builds_it(tmp_path, monkeypatch, capsys):
    source, copy, written = tmp_path / "secret.txt", tmp_path / "copied.txt", tmp_path / "written.txt"
    source.write_text("secret")
    evil = f"+hydra.callbacks.evil={{_target_: shutil.copy, src: {source}, dst: {copy}}}"
    write = [f"+hydra.callbacks.w={{_target_: pathlib.Path.write_text, _args_: [{written}, x]}}"]
    monkeypatch.chdir(tmp_path)
    # run.py as the command line runs it, in this process (Hydra would build the callbacks here)
    code, _, err = run_script(
        monkeypatch, capsys, evil, *write, "debug=fast", "logger=none", f"hydra.run.dir={tmp_path / 'run'}"
    )
    assert code == 1, err
    assert not copy.exists() and not written.exists()  # Hydra built nothing
    assert f"the override {evil} sets hydra.callbacks.evil._target_=shutil.copy" in err
    assert "hydra.callbacks.w._target_=pathlib.Path.write_text" in err
    assert "glmc.pipeline.run_folder.RunFolderGuard" in err and "Traceback" not in err
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


# 4, 5, 18. overwrite=true removes only the files glmc writes, inside the run folder


def _write(root, names, text="x"):
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def _files(root):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def test_paths_in_the_old_results_never_lead_outside_the_run_folder(tmp_path):
    run_dir, victim = tmp_path / "a" / "run", tmp_path / "a" / "victim"
    _write(victim, ["keep.txt"])
    (run_dir / "series" / "step_..").mkdir(parents=True)  # run/series/step_../../../../victim is `victim`
    saved = {"series": {"steps": ["../../../../victim"]}, "methods": {"../../victim": {}}, "matrix": {}}
    (run_dir / "results.json").write_text(json.dumps(saved))
    assert (run_dir / "series" / "step_../../../../victim").resolve() == victim.resolve()
    remove_previous_outputs(run_dir)
    assert (victim / "keep.txt").read_text() == "x"
    assert not (run_dir / "results.json").exists() and (run_dir / "series" / "step_..").is_dir()


def test_a_finished_series_keeps_the_users_files_in_its_step_folders(tmp_path):
    run_dir = tmp_path / "run"
    ours = [
        "results.json",
        "barrier.csv",
        "series.png",
        "matrix.png",
        "matrix_weight.csv",
        "weight/diagnostics_0-1.json",
        "series/step_100/weight/diagnostics_0-1.json",
        "series/step_100/learned/pair_0123456789ab/checkpoints/last.ckpt",
        "series/step_200/weight/diagnostics_0-1.json",
        "series/step_200/weight/hf_0-1/model.safetensors",
        "series/step_200/weight/hf_0-1/config.json",
        "series/step_200/weight/.diagnostics_0-1.json.tmp-ab12.json",  # an interrupted atomic write
    ]
    users = [
        "series/step_100/notes.txt",
        "series/step_100/weight/mine.txt",
        "series/step_100/learned/pair_0123456789ab/checkpoints/notes.txt",
        "weight/hf_0-1/README.md",
        "weight/diagnostics_mine.json",
        "matrix_notes.csv",
        "logs/weight_0-1/metrics.csv",
        "mine/diagnostics_0-1.json",  # not a method's folder
    ]
    _write(run_dir, ours + users)
    card = "series/step_200/weight/hf_0-1/README.md"  # an export's model card, by its mark; the user's stays
    _write(run_dir, [card], model_card(None, "weight", (SimpleNamespace(seed=0), SimpleNamespace(seed=1)), {}))
    (run_dir / "results.json").write_text(json.dumps({"series": {"steps": [100]}, "methods": {"weight": {}}}))
    assert sorted(p.relative_to(run_dir).as_posix() for p in previous_outputs(run_dir)) == sorted([*ours, card])
    remove_previous_outputs(run_dir)
    assert _files(run_dir) == sorted(users)
    assert not (run_dir / "series" / "step_200").exists()  # left empty: removed
    assert not (run_dir / "series" / "step_100" / "learned" / "pair_0123456789ab" / "last.ckpt").exists()


def test_a_trained_run_over_a_finished_spawn_run_leaves_none_of_its_outputs(tmp_path, tiny_overrides):
    run_dir = tmp_path / "run"
    spawned = ["spawn.png", "spawn/step_0/weight/diagnostics_1-5.json", "spawn/step_2/weight/diagnostics_1-5.json"]
    _write(run_dir, [*spawned, "spawn/step_2/notes.txt"])
    (run_dir / "results.json").write_text(json.dumps({"config": {"endpoints": {"source": "spawn"}}, "methods": {}}))
    run_pipeline(compose_config(*tiny_overrides, "matcher.methods=[vanilla]", "overwrite=true"), run_dir)
    assert not (run_dir / "spawn.png").exists() and not (run_dir / "spawn" / "step_0").exists()
    assert _files(run_dir / "spawn") == ["step_2/notes.txt"]  # the user's file, in the folder it was in
    assert list(json.loads((run_dir / "results.json").read_text())["methods"]) == ["vanilla"]


# 6. matplotlib keeps its configuration and font cache in glmc's cache folder, not under $HOME


def test_matplotlib_writes_nothing_under_home(tmp_path):
    home, cache = tmp_path / "home", tmp_path / "cache"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("MPLCONFIGDIR", "XDG_CONFIG_HOME", "XDG_CACHE_HOME")}
    # seeds=[0] is refused by the pipeline's check, after its imports brought matplotlib in
    proc = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), "debug=fast", "logger=none", "seeds=[0]", f"cache_dir={cache}"]
        + [f"hydra.run.dir={tmp_path / 'run'}"],
        capture_output=True,
        text=True,
        env={**env, "HOME": str(home), "OMP_NUM_THREADS": "1"},
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 1 and "seeds=[0]" in proc.stderr, proc.stderr
    assert list(home.iterdir()) == []
    assert list((cache / "matplotlib").glob("fontlist*.json"))  # matplotlib's font cache, where it belongs


def test_a_matplotlib_folder_the_user_chose_is_kept(monkeypatch, tmp_path):
    monkeypatch.delitem(sys.modules, "matplotlib", raising=False)  # as before the first import
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path / "mine"))
    assert use_cache_for_matplotlib(tmp_path / "cache") is None
    assert os.environ["MPLCONFIGDIR"] == str(tmp_path / "mine")
    monkeypatch.delenv("MPLCONFIGDIR")
    assert use_cache_for_matplotlib(tmp_path / "cache") == tmp_path / "cache" / "matplotlib"
    assert os.environ["MPLCONFIGDIR"] == str(tmp_path / "cache" / "matplotlib")


# 14. logger=wandb logger.mode=online without an API key is refused before any work


@pytest.fixture
def no_wandb_login(monkeypatch, tmp_path):
    """No key anywhere W&B looks: an empty home, W&B's settings in an empty folder."""
    for var in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL", "NETRC"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
    return tmp_path / "home"


def test_wandb_online_without_a_key_is_refused_before_training(tmp_path, tiny_overrides, no_wandb_login):
    cfg = compose_config(*tiny_overrides, "logger=wandb", "logger.mode=online")
    with pytest.raises(ConfigError) as err:
        run_pipeline(cfg, tmp_path / "run")
    message = str(err.value)
    assert "logger.mode=online" in message and "wandb login" in message and "logger.mode=offline" in message
    assert str(no_wandb_login / ".netrc") in message
    assert not (tmp_path / "endpoints").exists() and not (tmp_path / "run" / "results.json").exists()


def test_a_key_where_wandb_reads_it_lets_an_online_run_start(tmp_path, monkeypatch, no_wandb_login):
    online = compose_config("logger=wandb", "logger.mode=online")
    assert wandb_login_problems(compose_config("logger=wandb")) == []  # offline needs no key
    key = "a" * 40
    (no_wandb_login / ".netrc").write_text(f"machine api.wandb.ai\n  login user\n  password {key}\n")
    assert wandb_login_problems(online) == []
    # a key for another server does not count; `wandb login --host` saves that server in W&B's settings
    (no_wandb_login / ".netrc").write_text(f"machine wandb.example.com\n  login user\n  password {key}\n")
    assert "https://api.wandb.ai" in wandb_login_problems(online)[0]
    (tmp_path / "wandb_config").mkdir()
    (tmp_path / "wandb_config" / "settings").write_text("[default]\nbase_url = https://wandb.example.com\n")
    assert wandb_login_problems(online) == []
    (no_wandb_login / ".netrc").unlink()
    monkeypatch.setenv("WANDB_API_KEY", key)
    assert wandb_login_problems(online) == []
