"""What an earlier run recorded in a run folder's results.json wrote there, and its removal under
overwrite=true: the user's own files in the folder are never among it."""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# what a run writes into its folder besides one folder per method (glmc.pipeline.run, .outputs, .multi)
RESULT_FILES = ("results.json", "barrier.csv", "barrier.png", "simplex.png", "series.png", "matrix.png")
KEPT_FOLDERS = ("logs", "wandb", ".hydra")  # logs of earlier runs and Hydra's record stay
# checkpoint folders of learned matching (pair_<hash>) and of the universe refinement (universe_<hash>),
# named by glmc.matching.base.settings_hash
CHECKPOINT_FOLDER = re.compile(r"(pair|universe)_[0-9a-f]{12}")


def _pair_labels(saved: dict[str, Any]) -> set[str]:
    """The `<a>-<b>` labels of every pair in `saved`'s methods, which name its files."""
    labels = set()
    for method in (saved.get("methods") or {}).values():
        for pair in (method.get("pairs") or []) if isinstance(method, dict) else []:
            ends = (pair.get("endpoints") or pair.get("seeds")) if isinstance(pair, dict) else None
            if isinstance(ends, list) and ends:
                labels.add("-".join(str(e) for e in ends))
    return labels


def _saved_results(run_dir: Path) -> dict[str, Any]:
    try:
        saved = json.loads((Path(run_dir) / "results.json").read_text())
    except (OSError, ValueError):
        return {}
    return saved if isinstance(saved, dict) else {}


def method_folders(run_dir: Path) -> list[Path]:
    """The folders of the methods recorded in `run_dir`/results.json (and universe/ of a multi-model run)."""
    saved = _saved_results(run_dir)
    names = list(saved.get("methods") or {}) + (["universe"] if saved.get("multi") else [])
    folders = [
        Path(run_dir) / n
        for n in names
        if isinstance(n, str) and n and Path(n).name == n and not n.startswith(".") and n not in KEPT_FOLDERS
    ]
    return [p for p in folders if p.is_dir() and not p.is_symlink()]


def previous_outputs(run_dir: Path) -> list[Path]:
    """What the run recorded in `run_dir`/results.json wrote there: in each method folder its diagnostics,
    exports and checkpoint folders (never a link, nor the user's files), then its result files."""
    run_dir = Path(run_dir)
    labels = _pair_labels(_saved_results(run_dir))
    files, exports = {f"diagnostics_{label}.json" for label in labels}, {f"hf_{label}" for label in labels}
    inside = [
        path
        for folder in method_folders(run_dir)
        for path in sorted(folder.iterdir())
        if not path.is_symlink()
        and (
            (path.is_file() and path.name in files)
            or (path.is_dir() and (path.name in exports or CHECKPOINT_FOLDER.fullmatch(path.name)))
        )
    ]
    saved = _saved_results(run_dir)  # a series' step folders and the matrices' CSVs (glmc.pipeline.series, .matrix)
    steps = [run_dir / "series" / f"step_{s}" for s in (saved.get("series") or {}).get("steps") or []]
    csvs = [
        f"matrix_{n if kind == 'pairwise' else 'universe_' + n}.csv"
        for kind, m in (saved.get("matrix") or {}).items()
        for n in m
    ]
    return (
        inside
        + [p for p in steps if p.is_dir() and not p.is_symlink()]
        + [run_dir / f for f in (*RESULT_FILES, *csvs) if (run_dir / f).is_file()]
    )


def remove_previous_outputs(run_dir: Path) -> None:
    """Remove `previous_outputs`, and the method folders left empty (the user's own files stay)."""
    folders = method_folders(run_dir)
    for path in previous_outputs(run_dir):
        log.info("overwrite=true: removing %s of the replaced results", path)
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    for folder in folders:
        if not any(folder.iterdir()):
            folder.rmdir()
