"""Configuration safety and paths, checked before any work: every `_target_` of the composed config names
a class glmc builds (Lightning's Trainer, callbacks and plugins; matchers through the registry) or the run
is refused by key path and value; W&B writes nothing under the home directory; folders that loop, a
cache_dir that is a file and a cache_dir that cannot be written are refused by name."""

from __future__ import annotations

import os
import re

import pytest
from omegaconf import OmegaConf

from glmc.pipeline.refusals import is_refusal
from glmc.pipeline.run import run_pipeline
from glmc.pipeline.run_folder import check_writable
from glmc.pipeline.targets import target_problems
from glmc.pipeline.tracking import WANDB_FOLDERS, Tracker
from glmc.pipeline.validate import ConfigError, validate_config

from conftest import compose_config, make_read_only, run_script

CALLS: list[tuple] = []
LOOP = "a symbolic link on this path leads back to itself (a loop)"


def record_call(*args, **kwargs):
    """A function a config names: naming it must not run it."""
    CALLS.append((args, kwargs))


@pytest.fixture
def loop(tmp_path):
    """A symbolic link that leads back to itself through a second one."""
    (tmp_path / "loop_b").symlink_to(tmp_path / "loop_a")
    (tmp_path / "loop_a").symlink_to(tmp_path / "loop_b")
    return tmp_path / "loop_a"


@pytest.fixture
def quiet_hydra(monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)


# 7. `_target_` allow-list


def _copy(src, dst) -> str:
    return f"{{_target_: shutil.copy, src: '{src}', dst: '{dst}'}}"


CALLBACK = "{_target_: lightning.pytorch.callbacks.EarlyStopping, monitor: val_loss}"


@pytest.mark.parametrize(
    "override,where",
    [
        ("+trainer.callbacks=[COPY]", "trainer.callbacks[0]._target_=shutil.copy: is not a class glmc builds"),
        (f"+trainer.callbacks=[{CALLBACK},COPY]", "trainer.callbacks[1]._target_=shutil.copy: is not a class glmc"),
        ("+trainer.plugins=[{_target_: os.system, command: 'touch DST'}]", "trainer.plugins[0]._target_=os.system"),
        (f"trainer._target_={__name__}.record_call", f"trainer._target_={__name__}.record_call: is not Lightning's"),
        ("+data.extra={helper: COPY}", "data.extra.helper._target_=shutil.copy: is not a class glmc builds"),
        (
            "+trainer.callbacks=[{_target_: lightning.pytorch.callbacks.model_checkpoint.Path}]",
            "trainer.callbacks[0]._target_=lightning.pytorch.callbacks.model_checkpoint.Path: is not a class",
        ),
        (f"+trainer.callbacks=[{{_target_: {__name__}.record_call}}]", f"[0]._target_={__name__}.record_call: is"),
    ],
)
def test_a_target_outside_the_allow_list_is_refused_by_key_path_before_any_work(tmp_path, override, where):
    CALLS.clear()
    src, dst = tmp_path / "secret.txt", tmp_path / "copied.txt"
    src.write_text("secret")
    override = override.replace("COPY", _copy(src, dst)).replace("DST", str(dst))
    cfg = compose_config("debug=fast", "logger=none", f"cache_dir={tmp_path / 'cache'}", override)
    with pytest.raises(ConfigError, match=re.escape(where)) as err:
        run_pipeline(cfg, tmp_path / "run")
    assert "or remove the node" in str(err.value) or "set it back to lightning.pytorch.Trainer" in str(err.value)
    assert not dst.exists() and CALLS == []  # nothing named was called
    assert not (tmp_path / "run").exists() and not (tmp_path / "cache").exists()


def test_lightning_callbacks_and_plugins_pass():
    cfg = compose_config(
        "debug=fast",
        "logger=none",
        f"+trainer.callbacks=[{CALLBACK},{{_target_: lightning.pytorch.callbacks.early_stopping.EarlyStopping}}]",
        "+trainer.plugins=[{_target_: lightning.pytorch.plugins.environments.LightningEnvironment}]",
    )
    assert target_problems(cfg) == []
    validate_config(cfg)


def test_every_matcher_node_is_checked_and_the_hydra_node_is_hydras():
    cfg = compose_config("debug=fast", "matcher.methods=[vanilla]", "matcher.weight._target_=builtins.print")
    with pytest.raises(ConfigError, match=re.escape("matcher.weight._target_=builtins.print: is a builtin_")):
        validate_config(cfg)  # weight is not run, and its target is still refused
    hydra_only = OmegaConf.create({"hydra": {"callbacks": {"guard": {"_target_": "os.system"}}}})
    assert target_problems(hydra_only) == []
    assert target_problems(OmegaConf.create({"other": {"guard": {"_target_": "os.system"}}})) == [
        "other.guard._target_=os.system: is not a class glmc builds from the config; name a callback class of "
        "lightning.pytorch.callbacks (e.g. lightning.pytorch.callbacks.EarlyStopping) or a plugin class of "
        "lightning.pytorch.plugins, or remove the node"
    ]


# 8. W&B writes inside the run folder


def test_an_offline_wandb_run_writes_nothing_under_home(tmp_path, monkeypatch):
    home, run_dir, mine = tmp_path / "home", tmp_path / "run", tmp_path / "my_wandb_data"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path / "matplotlib"))  # not W&B's
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "WANDB_DIR", "WANDB_MODE", *WANDB_FOLDERS):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_DATA_DIR", str(mine))  # a folder the user names is kept
    run_dir.mkdir()
    (run_dir / "results.json").write_text("{}")
    with Tracker(compose_config("debug=fast", "logger=wandb"), run_dir) as tracker:
        assert tracker.log_results({"methods": {}}) is not None  # an artifact: staged copies of results.json
    assert sorted(p.relative_to(home) for p in home.rglob("*")) == []
    assert list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert list((run_dir / "wandb" / "cache").rglob("core-debug-*.log"))  # W&B's service log
    assert (mine / "artifacts" / "staging").is_dir() and not (run_dir / "wandb" / "data").exists()
    assert os.environ["WANDB_DATA_DIR"] == str(mine)
    assert not {"WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_ARTIFACT_DIR"} & set(os.environ)


# 9. folders that loop, a cache_dir that is a file or read-only


def _refused(tmp_path, message: str, *overrides: str) -> str:
    cfg = compose_config("debug=fast", "logger=none", *overrides)
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        run_pipeline(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()
    return str(err.value)


def test_a_cache_dir_that_loops_or_is_a_file_is_refused_by_name(tmp_path, loop):
    _refused(tmp_path, f"cache_dir={loop}: {LOOP}", f"cache_dir={loop}")
    _refused(tmp_path, f"cache_dir={loop}/endpoints: {LOOP}", f"cache_dir={loop}/endpoints")
    file = tmp_path / "file"
    file.write_text("not a folder")
    _refused(tmp_path, f"cache_dir={file}: is a file, not a folder", f"cache_dir={file}")
    _refused(tmp_path, f"cache_dir={file}/cache: cannot be created: {file} is a file", f"cache_dir={file}/cache")
    assert file.read_text() == "not a folder"


def test_a_read_only_cache_dir_is_refused_before_any_work(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    make_read_only(monkeypatch, cache)
    _refused(tmp_path, f"cache_dir={cache}: is not writable (Permission denied)", f"cache_dir={cache}")
    _refused(tmp_path, f"cache_dir={cache}/new: cannot be created in {cache}", f"cache_dir={cache}/new")
    assert list(cache.iterdir()) == []


def test_an_endpoint_folder_that_loops_is_refused_on_the_command_line(tmp_path, loop, monkeypatch, capsys, quiet_hydra):
    folder = tmp_path / "model"
    folder.mkdir()
    args = ("debug=fast", "logger=none", "endpoints=pretrained", f"hydra.run.dir={tmp_path / 'run'}")
    code, _, err = run_script(monkeypatch, capsys, *args, f"endpoints.paths=[{folder},{loop}]")
    assert code == 1 and "Traceback" not in err
    assert f"endpoints.paths[1]={loop}: {LOOP}" in err and "endpoints.paths[0]" not in err


def test_a_run_folder_that_loops_is_refused_on_the_command_line(tmp_path, loop, monkeypatch, capsys, quiet_hydra):
    with pytest.raises(PermissionError, match=re.escape(f"the run folder {loop / 'run'} cannot be created")) as err:
        check_writable(loop / "run")
    assert is_refusal(err.value)
    args = ("debug=fast", "logger=none", f"cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={loop}")
    code, _, err = run_script(monkeypatch, capsys, *args)
    assert code == 1 and "Traceback" not in err
    assert f"Error: the run folder {loop} cannot be created: {LOOP}" in err
    assert not (tmp_path / "cache").exists()


def test_configured_callbacks_join_every_trainer_as_new_instances():
    from lightning.pytorch.callbacks import LearningRateMonitor

    from glmc.train.trainer import trainer_factory

    cfg = compose_config("+trainer.callbacks=[{_target_: lightning.pytorch.callbacks.LearningRateMonitor}]")
    make = trainer_factory(cfg.trainer)

    first, second = (make(logger=False) for _ in range(2))
    found = [[c for c in t.callbacks if isinstance(c, LearningRateMonitor)] for t in (first, second)]
    assert len(found[0]) == len(found[1]) == 1
    assert found[0][0] is not found[1][0]  # no state shared between trainers


def test_the_python_api_trainer_passes_the_same_allow_list():
    from glmc.api import _trainer

    with pytest.raises(ValueError, match=r"trainer\._target_=shutil\.copy: is not Lightning's Trainer"):
        _trainer({"_target_": "shutil.copy"})


def test_a_target_behind_an_interpolation_is_found_where_it_is_read():
    """Plain references are walked where they point; a resolver that builds a node is resolved and walked."""
    cfg = OmegaConf.create(
        {
            "shared": {"_target_": "shutil.copy"},
            "ref": "${shared}",
            "built": "${oc.create:{_target_: os.system}}",
            "hydra": {"_target_": "os.system"},
            "via_hydra": "${hydra}",
        }
    )
    found = target_problems(cfg)
    assert [p.split(":")[0] for p in found] == [
        "shared._target_=shutil.copy",
        "built._target_=os.system",
        "via_hydra._target_=os.system",
    ]
