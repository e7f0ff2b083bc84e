"""Worker processes that end with the process that started them, so that a killed run leaves no worker training
for nobody and holding its seed's cache lock: Linux's parent-death signal, else a thread that polls.
Standard library only, so that a spawned worker can run it before its heavy imports."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def _kernel_ends_us() -> bool:
    """Ask Linux to send this process SIGKILL when its parent ends; whether it agreed."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):  # no libc to load, or one without prctl
        return False


def _watch(parent: int, poll: float) -> None:
    while os.getppid() == parent:  # an orphan is handed to another process (init or a subreaper)
        time.sleep(poll)
    os._exit(1)


def end_with_parent(parent: int, poll: float = 0.5, kernel: bool = True) -> str:
    """End this process when `parent` ends; returns how: "kernel" (Linux) or "thread" (polling)."""
    how = "kernel" if kernel and _kernel_ends_us() else "thread"
    if how == "thread":
        threading.Thread(target=_watch, args=(parent, poll), name="end-with-parent", daemon=True).start()
    if os.getppid() != parent:  # the parent ended before the request took effect: nothing will signal it
        os._exit(1)
    return how
