"""Worker processes that end with the process that started them.

A worker that outlived its parent (the run killed with SIGKILL, which no handler sees) would go on
training for nobody and hold its seed's cache lock, so that the rerun waits on it. `end_with_parent`,
called first thing in the worker, ends the worker when its parent ends: on Linux the kernel sends it
SIGKILL (prctl PR_SET_PDEATHSIG); elsewhere, or where prctl is refused, a daemon thread checks every
`poll` seconds whether the parent is still its parent. Nothing is lost by the abrupt end: checkpoints
and cache entries are renamed into place only when complete, and the kernel releases the worker's locks.
Linux signals the worker when the parent's thread that started it ends: a process pool starts its
workers from the thread that submits to it, and that thread waits for them.

Standard library only, so that a spawned worker can run it before its heavy imports.
"""

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
    """End this process when process `parent`, the one that started it, ends. Returns how: "kernel"
    (Linux's parent-death signal) or "thread" (the portable watch; also with `kernel=False`)."""
    how = "kernel" if kernel and _kernel_ends_us() else "thread"
    if how == "thread":
        threading.Thread(target=_watch, args=(parent, poll), name="end-with-parent", daemon=True).start()
    if os.getppid() != parent:  # the parent ended before the request took effect: nothing will signal it
        os._exit(1)
    return how
