"""Stand-ins for what a spawned worker process runs, in a module of their own: a worker imports only this
(and the pool's own set-up), not a test module's imports."""

from __future__ import annotations

import os
import threading
from pathlib import Path

LONG = 300  # seconds: far longer than a test waits for anything, so that finishing at all is the failure


def train_until_stopped(cfg, index, key, run_dir) -> float:
    """glmc.pipeline.endpoints.train_seed's stand-in: says it started (`started_<index>` holds its pid), then
    trains for LONG seconds unless stopped, and says it finished."""
    (Path(run_dir) / f"started_{index}").write_text(str(os.getpid()))
    threading.Event().wait(LONG)
    (Path(run_dir) / f"finished_{index}").write_text("")
    return float(LONG)
