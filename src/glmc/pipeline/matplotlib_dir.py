"""Where matplotlib keeps its configuration and font cache during a run: a folder of glmc's cache
(`<cache_dir>/matplotlib`) rather than $HOME/.config/matplotlib and $HOME/.cache/matplotlib. matplotlib
reads MPLCONFIGDIR once, when first imported, so run.py sets it before importing the pipeline; a
MPLCONFIGDIR the user set is kept."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def use_cache_for_matplotlib(cache_dir: str | Path | None) -> Path | None:
    """Point MPLCONFIGDIR at `cache_dir`/matplotlib unless set already; the folder, or None where the
    user's MPLCONFIGDIR stays (or matplotlib was imported already and chose its own, or no cache_dir)."""
    if not cache_dir or os.environ.get("MPLCONFIGDIR") or "matplotlib" in sys.modules:
        return None
    folder = Path(str(cache_dir)).expanduser().absolute() / "matplotlib"
    os.environ["MPLCONFIGDIR"] = str(folder)  # inherited by the processes the run starts
    return folder
