"""The run folder: whether a run may write into it (`check_run_dir`), locked for the run by `RunFolderGuard`;
what an earlier run wrote there is listed by glmc.pipeline.previous_outputs."""

from __future__ import annotations

import copy
import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from glmc.config import Config
from glmc.pipeline.validate import validate_config
from glmc.safe_files import unwritable

log = logging.getLogger(__name__)

# Keys that do not change any number in results.json: a rerun may differ in them.
NOT_RESULTS = (
    "overwrite",
    "logger",
    "cache_dir",
    "data.root",
    "data.download",
    "trainer.enable_progress_bar",
    "trainer.log_every_n_steps",
    "threads",  # how fast, not what: numbers may differ in the last bits only
    "train.parallel_endpoints",  # how many endpoints train at once, each as it would alone
    "pretrain.train.parallel_endpoints",
    "train.ensemble",  # the seeds trained as one batched model: the last bits only, as with threads
    "pretrain.train.ensemble",
    "symmetry.name",  # the group's label (auto, orthogonal, ...): its classes, compared resolved, are what ran
)


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for k, v in node.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out if out or not prefix else {prefix[:-1]: {}}
    return {prefix[:-1]: node}


# keys added to the schema after runs were recorded, with the value those runs had: a results.json
# without them records that value
LATER_KEYS = {"endpoints.source": "trained", "endpoints.paths": [], "data.path": None}
# classes that moved to another module after runs were recorded: a results.json naming the old path
# names the same class
MOVED_TARGETS = {"glmc.matching.canonical.CanonicalMatcher": "glmc.matching.unaligned.CanonicalMatcher"}


def config_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """`key: saved -> current` for every result-changing key that differs, in config order."""
    old, new = _flatten(saved), _flatten(current)
    old = {**{k: v for k, v in LATER_KEYS.items() if k in new and k not in old}, **old}
    old = {k: MOVED_TARGETS.get(v, v) if k.endswith("._target_") else v for k, v in old.items()}
    keys = list(new) + [k for k in old if k not in new]
    missing = "<absent>"
    return [
        f"{k}: {json.dumps(old.get(k, missing))} -> {json.dumps(new.get(k, missing))}"
        for k in keys
        if not any(k == n or k.startswith(n + ".") for n in NOT_RESULTS) and old.get(k, missing) != new.get(k, missing)
    ]


def check_writable(run_dir: Path, setting: str = "hydra.run.dir", what: str = "run folder") -> None:
    """PermissionError naming `run_dir` (the `what` that `setting` chooses) when it cannot be created or written."""
    run_dir = Path(run_dir)
    kind, existing, reason = unwritable(run_dir) or ("", run_dir, "")
    if kind == "loop":
        raise PermissionError(
            f"the {what} {run_dir} cannot be created: a symbolic link on this path leads back to itself "
            f"(a loop); remove the link or choose another folder ({setting}=...)"
        )
    if kind == "file":
        raise PermissionError(
            f"the {what} {run_dir} cannot be created: {existing} is not a folder; choose another folder ({setting}=...)"
        )
    if kind == "denied":
        where = "is not writable" if existing == run_dir else f"cannot be created in {existing}"
        raise PermissionError(
            f"the {what} {run_dir} {where} ({reason}); make it writable or choose another folder ({setting}=...)"
        )


def check_links(run_dir: Path) -> None:
    """FileExistsError naming the first symbolic link inside `run_dir` that leads out of it."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return
    root = run_dir.resolve()
    for folder, dirs, files in os.walk(run_dir):  # never follows a link to a folder
        for name in dirs + files:
            path = Path(folder) / name
            if path.is_symlink() and not path.resolve().is_relative_to(root):
                raise FileExistsError(
                    f"{path} is a symbolic link to {os.readlink(path)}, outside the run folder {run_dir}: a run "
                    "writes only into its own folder; remove the link, or choose another folder (hydra.run.dir=...)"
                )


def check_run_dir(cfg: Config, run_dir: Path) -> bool:
    """Refuses `run_dir` holding another config's results unless overwrite=true; True when it replaces them."""
    from glmc.pipeline.outputs import config_as_saved  # matplotlib with it: after use_cache_for_matplotlib

    check_writable(run_dir)
    check_links(run_dir)
    results = Path(run_dir) / "results.json"
    if not results.is_file():
        return False
    try:
        saved = json.loads(results.read_text()).get("config")
        if not isinstance(saved, dict):
            raise ValueError("no config recorded")
        differences = config_differences(saved, config_as_saved(cfg))
    except (OSError, ValueError, AttributeError) as err:
        differences = [f"its results.json records no readable config ({err})"]
    if not differences:
        return False
    shown = "; ".join(differences[:3]) + (f"; and {len(differences) - 3} more" if len(differences) > 3 else "")
    if cfg.get("overwrite", False):
        log.warning("overwrite=true: replacing the results in %s of a different config (%s)", run_dir, shown)
        return True
    raise FileExistsError(
        f"{run_dir} already holds the results of a different config ({shown}): pass overwrite=true to "
        "replace them (it removes only the files glmc writes: results.json, barrier.csv, the plots and matrix "
        "CSVs, and in each method folder, also those under series/ and spawn/, its diagnostics_*.json, hf_* "
        "exports and checkpoints, then the folders left empty; your own files there are kept), or choose "
        "another folder (hydra.run.dir=...)"
    )


class FolderHeld(FileExistsError):
    """Another run holds the run folder's lock: nothing may be written there, not even a failure record."""


LOCK_NAME = ".glmc-run.lock"  # hidden: never a result, and kept after the run (a name other runs share)


def hold_run_dir(run_dir: Path, setting: str = "hydra.run.dir") -> tuple[FileLock, bool]:
    """(the lock on `run_dir`, whether this call created its file); FolderHeld naming another holder."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_NAME
    created = not path.exists()
    lock = FileLock(str(path), thread_local=False)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        try:
            pid = path.read_text().strip()
        except OSError:
            pid = ""
        holder = f" (pid {pid})" if pid.isdigit() else ""
        raise FolderHeld(
            f"another run{holder} is writing into the run folder {run_dir} (it holds {path}): wait for it to "
            f"finish, or choose another folder ({setting}=...)"
        ) from None
    path.write_text(f"{os.getpid()}\n")  # the holder's pid, for the refusal above
    return lock, created


def _rank_zero() -> bool:
    """The other ranks of a multi-process run write into the folder rank 0 holds."""
    return all(int(os.environ.get(name, 0)) == 0 for name in ("RANK", "LOCAL_RANK", "NODE_RANK"))


@contextmanager
def held_job_folder(job_dir: Path) -> Iterator[None]:
    """A multirun job's folder, locked as a single run's is (RunFolderGuard) while the job runs: two sweeps
    into one hydra.sweep.dir never write one job folder at once. FolderHeld naming it where held."""
    if not _rank_zero():
        yield
        return
    lock, _ = hold_run_dir(Path(job_dir), setting="hydra.sweep.dir")
    try:
        yield
    finally:
        lock.release(force=True)


class RunFolderGuard(Callback):
    """Locks the run folder until the run ends and checks it before Hydra writes there; a refusal exits here
    (Hydra would make it a warning) and leaves the folder as it was."""

    def __init__(self) -> None:
        self._lock: tuple[FileLock, bool] | None = None  # (the held lock, whether its file is this run's)

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        from glmc.pipeline.refusals import exit_if_refused, is_refusal

        try:
            self._check(config)
        except Exception as err:
            if is_refusal(err):
                self._release(refused=True)
            exit_if_refused(err)
            raise

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._release()

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """A sweep folder that cannot be made (a link loop, a file, no permission) is refused by name before
        any job starts (each job folder is locked while its job runs: held_job_folder)."""
        from glmc.pipeline.refusals import exit_if_refused

        try:
            check_writable(Path(str(config.hydra.sweep.dir)), setting="hydra.sweep.dir", what="sweep folder")
        except PermissionError as err:
            exit_if_refused(err)
            raise

    def _release(self, refused: bool = False) -> None:
        if self._lock is not None:
            lock, created = self._lock
            self._lock = None
            if refused and created:  # a refused run leaves the folder as it was
                Path(lock.lock_file).unlink(missing_ok=True)  # while held: no other run is between the two
            lock.release(force=True)

    def _check(self, config: DictConfig) -> None:
        from glmc.pipeline.matplotlib_dir import use_cache_for_matplotlib
        from glmc.symmetry.family_defaults import check_residual_classes, resolve_run_symmetry

        # before check_run_dir's imports bring matplotlib in
        use_cache_for_matplotlib(OmegaConf.select(config, "cache_dir", throw_on_resolution_failure=False))
        run_dir = Path(str(config.hydra.run.dir))
        check_writable(run_dir)
        check_links(run_dir)
        task = copy.deepcopy(config)  # the task function's config: everything but the `hydra` node
        with read_write(task), open_dict(task):
            del task["hydra"]
        check_residual_classes(task)  # before the folder is touched
        if _rank_zero():
            self._lock = hold_run_dir(run_dir)
        if (run_dir / "results.json").is_file():
            with read_write(task):  # compared as run_pipeline compares it: validated, symmetry=auto resolved
                resolve_run_symmetry(task, validate_config(task))
            check_run_dir(task, run_dir)
