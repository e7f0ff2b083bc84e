"""Shared fixtures: compose the real Hydra config the way run.py does, with overrides."""

from __future__ import annotations

import functools
import importlib.util
import os
import pickle
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.override_parser.overrides_parser import OverridesParser

from glmc.config import register_configs

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
register_configs()

# One matplotlib font cache for the whole test run (subprocesses inherit it): a run would otherwise build one
# in each test's own cache_dir (glmc points matplotlib there unless MPLCONFIGDIR is set), seconds each time.
os.environ.setdefault("MPLCONFIGDIR", str(Path(tempfile.gettempdir()) / f"glmc-tests-matplotlib-{os.getuid()}"))

# GLMC_TEST_THREADS=1 runs torch's CPU kernels on one thread: the summation order of a one-core machine.
if os.environ.get("GLMC_TEST_THREADS"):
    torch.set_num_threads(int(os.environ["GLMC_TEST_THREADS"]))


@functools.lru_cache(maxsize=512)
def _composed(overrides: tuple[str, ...]):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


@functools.lru_cache(maxsize=512)
def _pickled(overrides: tuple[str, ...]) -> bytes:
    return pickle.dumps(_composed(overrides))


def _copy(overrides: tuple[str, ...]):
    """A copy of the composed config of `overrides` of its own (unpickled: a fifth of a deep copy's time)."""
    return pickle.loads(_pickled(overrides))


def compose_config(*overrides: str):
    """The config run.py composes from `overrides`. Composing takes Hydra about 0.2 s, a copy a hundredth of
    that: each override list is composed once per test process and every caller gets its own copy.

    Hydra composes the defaults (the group choices) and then sets each plain `key=value` override on the
    result (`ConfigLoaderImpl._apply_overrides_to_config`); the suite's hundreds of override lists share a
    few group choices, so the composed choices are kept and the values set on a copy the way Hydra sets
    them. Anything else (a group, a deletion, a sweep, a hydra key), or a value Hydra refuses, goes through
    Hydra's own compose, with its own error; test_conftest_compose.py checks that both give one config."""
    values = [o for o in overrides if _plain_value(o)]
    if not values:
        return _copy(tuple(overrides))
    cfg = _copy(tuple(o for o in overrides if not _plain_value(o)))
    try:
        parsed = OverridesParser.create().parse_overrides(values)
        if any(o.is_sweep_override() for o in parsed):
            raise ValueError("a sweep")
        ConfigLoaderImpl._apply_overrides_to_config(parsed, cfg)
    except Exception:  # Hydra's compose says what is wrong, as run.py would
        return _copy(tuple(overrides))
    return cfg


GROUPS = frozenset(p.name for p in CONF.iterdir() if p.is_dir())


def _plain_value(override: str) -> bool:
    """Whether `override` sets a value of the config (key=value or +key=value), not a group choice."""
    key, is_set, _ = override.partition("=")
    key = key.lstrip("+")
    return bool(is_set) and not key.startswith(("~", "hydra")) and "/" not in key and key not in GROUPS


def run_script(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """`python run.py args...` in this process (run.py executed as __main__, as the command line does,
    without a new interpreter's imports): (exit status, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["run.py", *args])
    spec = importlib.util.spec_from_file_location("__main__", ROOT / "run.py")
    try:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
        code = 0
    except SystemExit as stop:  # Hydra's main exits after a successful run too
        code = stop.code or 0
    out = capsys.readouterr()
    return code, out.out, out.err


class ForkedRun:
    """`python run.py args...` in a child forked from this process: the child keeps the imports (a new
    interpreter spends seconds importing before it starts) and can be signalled and killed like the command
    line's process. Its stdout and stderr go to `log`. Use it where a test must kill or signal the run;
    poll() and kill() mirror subprocess.Popen's."""

    def __init__(self, args: list[str], log: Path):
        self.returncode: int | None = None
        self.pid = os.fork()
        if self.pid == 0:  # the child: run.py as __main__, then leave without the parent's cleanup
            os._exit(_child_runs(args, log))

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            os.kill(self.pid, 9)
            self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])


def _child_runs(args: list[str], log: Path) -> int:
    import runpy
    import traceback

    code = 1
    try:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        sys.stdout = sys.stderr = open(1, "w", buffering=1, closefd=False)
        torch.set_num_threads(1)  # a forked child must not reuse the parent's thread pool
        os.chdir(ROOT)
        sys.argv = ["run.py", *args]
        runpy.run_path(str(ROOT / "run.py"), run_name="__main__")
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
    return code


def make_read_only(monkeypatch, folder: Path) -> None:
    """Make write probes in `folder` fail as a folder without write permission does, also when the tests
    run as root (who may write anywhere)."""
    import tempfile

    real = tempfile.TemporaryFile

    def read_only(*args, dir=None, **kwargs):
        if dir is not None and os.path.samefile(dir, folder):
            raise PermissionError(13, "Permission denied")
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "TemporaryFile", read_only)


def load_script(relative: str):
    """A command-line script of the repository (e.g. experiments/summarize.py) as a module, to call its
    main() in this process."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def tiny_overrides(tmp_path):
    """A seconds-long run whose endpoint cache lives in the test's own folder."""
    return ["debug=fast", f"cache_dir={tmp_path / 'endpoints'}", "logger=none"]


# The files whose tests take longest (subprocesses, spawned ranks, the reproduce fixture), longest first.
# They are collected before the others, so that `make test`'s two processes (pytest-xdist, one file at
# a time) start them early and finish together instead of one running a long file alone at the end.
LONG_FILES = (
    "test_reproduce.py",
    "test_reliability.py",
    "test_ensemble.py",
    "test_tasks.py",
    "test_paper_configs.py",
    "test_cache_key.py",
    "test_model_keys.py",
    "test_learned.py",
    "test_early_errors.py",
    "test_pretrained_endpoints.py",
    "test_config.py",
    "test_parallel_endpoints.py",
    "test_setting_ranges.py",
    "test_pipeline.py",
    "test_debug_fast.py",
    "test_evaluator.py",
    "test_sigterm.py",
    "test_sweeps.py",
    "test_wandb_offline.py",
    "test_api.py",
    "test_multi_pipeline.py",
    "test_roberta_finetune_report.py",
    "test_report_figures.py",
    "test_config_safety.py",
    "test_folder_reliability.py",
)


def pytest_collection_modifyitems(config, items):
    """Long files first (LONG_FILES); `gpu` tests run only where CUDA is visible and are reported as
    skipped elsewhere."""
    rank = {name: i for i, name in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_FILES)))  # stable: file order kept otherwise
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def one_thread():
    """torch on one intra-op thread for the test (results compared across ways of computing them)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
