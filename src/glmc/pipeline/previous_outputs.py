"""What an earlier run wrote into a run folder, and its removal under overwrite=true. Read from the folder's
own entries, by the names glmc gives its files: results.json only adds method names, matched against what
the folder holds (never joined into a path). Only those files go, then the folders they leave empty; the
user's own files, and the folders holding them, stay; nothing outside the folder is touched."""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

from glmc.pipeline.export_files import EXPORT_FILES
from glmc.pipeline.model_card import CARD_MARK
from glmc.settings.methods import METHODS, MULTI_METHODS

log = logging.getLogger(__name__)

# what a run writes into its folder besides one folder per method (glmc.pipeline.run, .outputs, .multi,
# .series, .children)
RESULT_FILES = ("results.json", "barrier.csv", "barrier.png", "simplex.png", "series.png", "matrix.png", "spawn.png")
RESULT_FILES += ("tasks.png",)
KEPT_FOLDERS = ("logs", "wandb", ".hydra")  # logs of earlier runs and Hydra's record stay
# a series (series/) and a spawn run (spawn/) measure each step into <kind>/step_<n>/<method>/
STEP_KINDS, STEP_FOLDER = ("series", "spawn"), re.compile(r"step_\d+")
# in a method folder: diagnostics_<a>-<b>.json, the midpoint export hf_<a>-<b>/ and the checkpoint folders of
# learned matching (pair_<hash>) and of the universe refinement (universe_<hash>, glmc.matching.base.settings_hash)
DIAGNOSTICS, EXPORT_FOLDER = re.compile(r"diagnostics_.+-.+\.json"), re.compile(r"hf_.+-.+")
CHECKPOINT_FOLDER = re.compile(r"(pair|universe)_[0-9a-f]{12}")
CHECKPOINT_FILE = re.compile(r"[^.].*\.ckpt")
SHARD = re.compile(r"model(-\d+-of-\d+)?\.safetensors")
TEMPORARY = re.compile(r"\.(.+)\.tmp-[^/]*")  # glmc.safe_files.atomic_path's, left by an interrupted write


def _ours(name: str, named: Callable[[str], bool]) -> bool:
    """`name` is a file glmc writes (`named`), or the temporary file of one."""
    temporary = TEMPORARY.fullmatch(name)
    return named(name) or (temporary is not None and named(temporary.group(1)))


def _entries(folder: Path) -> list[os.DirEntry]:
    try:
        with os.scandir(folder) as entries:
            return sorted(entries, key=lambda e: e.name)
    except OSError:  # gone, or not a folder
        return []


def _files(folder: Path, named: Callable[[str], bool]) -> list[Path]:
    """The plain files (never a link) directly in `folder` whose names glmc gives them."""
    return [Path(e.path) for e in _entries(folder) if e.is_file(follow_symlinks=False) and _ours(e.name, named)]


def _folders(folder: Path, named: Callable[[str], bool]) -> list[Path]:
    """The folders (never a link) directly in `folder` whose names `named` accepts."""
    return [Path(e.path) for e in _entries(folder) if e.is_dir(follow_symlinks=False) and named(e.name)]


def _saved_method_names(run_dir: Path) -> set[str]:
    """The method names results.json records (a custom matcher's folder): plain names only."""
    try:
        saved = json.loads((Path(run_dir) / "results.json").read_text())
    except (OSError, ValueError):
        return set()
    saved = saved if isinstance(saved, dict) else {}
    names = list(saved.get("methods") or {}) if isinstance(saved.get("methods"), dict) else []
    config = saved.get("config") if isinstance(saved.get("config"), dict) else {}
    listed = (config.get("matcher") or {}).get("methods") if isinstance(config.get("matcher"), dict) else None
    names += listed if isinstance(listed, list) else []
    return {n for n in names if isinstance(n, str)}


def _matrix_csv(names: set[str]) -> Callable[[str], bool]:
    """matrix_<method>.csv and matrix_universe_<method>.csv (glmc.pipeline.matrix)."""
    stems = names | {f"universe_{n}" for n in names}
    return lambda name: name.startswith("matrix_") and name.endswith(".csv") and name[7:-4] in stems


def _is_glmc_card(path: Path) -> bool:
    """Whether README.md is the model card an export wrote (its mark in the first lines), not the user's."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return CARD_MARK in f.read(4096)
    except OSError:
        return False


def _method_outputs(folder: Path) -> Iterator[Path]:
    """What a run wrote into one method folder: diagnostics, the export's files, the checkpoint files."""
    yield from _files(folder, DIAGNOSTICS.fullmatch)
    for export in _folders(folder, EXPORT_FOLDER.fullmatch):
        yield from _files(export, lambda name: name in EXPORT_FILES or SHARD.fullmatch(name) is not None)
        yield from [card for card in _files(export, "README.md".__eq__) if _is_glmc_card(card)]
    for checkpoints in _folders(folder, CHECKPOINT_FOLDER.fullmatch):
        yield from _files(checkpoints / "checkpoints", CHECKPOINT_FILE.fullmatch)


def previous_outputs(run_dir: Path) -> list[Path]:
    """The files an earlier run wrote into `run_dir`, found by their names: its result files and matrix CSVs,
    and in every method folder (also those of each step under series/ and spawn/) its diagnostics, exports
    and checkpoints (an export's README.md where it is glmc's model card). Never a link, a folder, or a file of
    another name (the user's own)."""
    run_dir = Path(run_dir)
    methods = set(METHODS) | set(MULTI_METHODS) | {"universe"} | _saved_method_names(run_dir)
    method = lambda name: name in methods and name not in KEPT_FOLDERS + STEP_KINDS  # noqa: E731
    csv = _matrix_csv(methods)
    found = _files(run_dir, lambda name: name in RESULT_FILES or csv(name))
    levels = [run_dir] + [
        s for kind in _folders(run_dir, STEP_KINDS.__contains__) for s in _folders(kind, STEP_FOLDER.fullmatch)
    ]
    for level in levels:
        for folder in _folders(level, method):
            found += _method_outputs(folder)
    return found


def remove_previous_outputs(run_dir: Path) -> None:
    """Remove `previous_outputs`, then each folder inside `run_dir` that this leaves empty (a folder still
    holding the user's files stays, and so does every folder above it)."""
    run_dir = Path(run_dir)
    root = run_dir.resolve()
    removed = 0
    for path in previous_outputs(run_dir):
        if path.is_symlink() or not path.resolve().is_relative_to(root):  # listed as plain files inside: kept so
            continue
        log.debug("overwrite=true: removing %s of the replaced results", path)
        path.unlink(missing_ok=True)
        removed += 1
        folder = path.parent
        while folder != run_dir and folder.is_relative_to(run_dir):
            try:
                folder.rmdir()  # only an empty folder goes
            except OSError:
                break
            folder = folder.parent
    if removed:
        log.info("overwrite=true: removed %d files of the replaced results from %s", removed, run_dir)
