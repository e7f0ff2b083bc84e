"""torch's intra-op thread count on a machine other processes share (the run's `threads` setting).

A parallel torch operation waits for its slowest thread: when another process keeps one core busy, every
operation split over all cores runs at the pace of the thread that shares that core, and a run on two
cores beside one busy process fell to a quarter of its speed (one thread kept nearly nine tenths).
`threads=auto` therefore chooses the count at the start of each stage (endpoint training, learned
matching, learned refinement) from the cores this process may use (os.sched_getaffinity), how busy
other processes keep them (/proc/stat sampled for a tenth of a second, this process's own time taken
out; the load average where /proc/stat cannot be read) and the size of the stage's work, never above
torch's count when the run started (OMP_NUM_THREADS and the like still cap it).
`threads=N` fixes N threads, `threads=null` leaves torch's default.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from contextlib import contextmanager

import torch

log = logging.getLogger(__name__)

# torch's grain: operations on fewer elements per thread are not split, so smaller work gains no thread
GRAIN = 32768
# a core other processes keep busy at least this share of the time is taken: a thread there would stall
# every parallel operation
TAKEN = 0.5
SAMPLE_SECONDS = 0.1
# a stage that starts within this many seconds of the last sample reuses it
RESAMPLE_AFTER = 10.0


def choose_threads(cores: int, busy: float, work: int | None = None) -> int:
    """Threads for `cores` usable cores of which other processes keep `busy` cores' worth busy (the sum
    of their shares), for a stage whose step touches `work` elements (its parameters; None: large): one
    per core not taken, at most one per GRAIN elements, at least one."""
    taken = int(max(busy, 0.0) + 1.0 - TAKEN)  # busy 0.5 -> 1 core taken, 1.4 -> 1, 1.5 -> 2
    count = cores - taken
    if work is not None:
        count = min(count, work // GRAIN)
    return max(1, min(count, cores))


def usable_cores() -> list[int]:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def _core_times(cores: list[int]) -> dict[int, tuple[int, int]] | None:
    """Per core (busy, total) clock ticks since boot from /proc/stat, None where it cannot be read."""
    wanted, out = {f"cpu{c}": c for c in cores}, {}
    try:
        with open("/proc/stat") as f:
            for line in f:
                name, *fields = line.split()
                if name in wanted:
                    ticks = [int(v) for v in fields[:8]]
                    idle = ticks[3] + ticks[4]  # idle and iowait
                    out[wanted[name]] = (sum(ticks) - idle, sum(ticks))
    except (OSError, ValueError, IndexError):
        return None
    return out if len(out) == len(cores) else None


def busy_cores(cores: list[int], seconds: float = SAMPLE_SECONDS) -> float:
    """How many of `cores`' worth of time other processes keep busy: /proc/stat over `seconds` less this
    process's own CPU time, or the 1-minute load average (capped at the cores) where /proc/stat fails."""
    before, own = _core_times(cores), time.process_time()
    if before is None:
        return min(float(os.getloadavg()[0]), float(len(cores)))
    time.sleep(seconds)
    after, own = _core_times(cores), time.process_time() - own
    if after is None:
        return min(float(os.getloadavg()[0]), float(len(cores)))
    busy = sum((after[c][0] - before[c][0]) / max(after[c][1] - before[c][1], 1) for c in cores)
    # the ticks cover about `seconds`: this process's own share of them is not another's
    return max(busy - own / seconds, 0.0)


class _Policy:
    """The run's setting, torch's count when it was set (the ceiling) and the last sample."""

    def __init__(self) -> None:
        self.setting: int | str | None = None
        self.original: int | None = None  # torch's count before any setting changed it
        self.ceiling = 1
        self.sampled: tuple[float, float] | None = None  # (when, busy)


_POLICY = _Policy()


def check_threads(value: object) -> str | None:
    """What is wrong with a `threads` value, or None: auto, a count of at least 1, or null."""
    if value is None or value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return None
    return f"threads={value!r}: use auto, a count of at least 1, or null for torch's default"


def configure(setting: int | str | None) -> None:
    """Apply the run's `threads`: a count now, auto at each stage (adapt), null not at all."""
    problem = check_threads(setting)
    if problem:
        raise ValueError(problem)
    _POLICY.setting, _POLICY.sampled = setting, None
    if _POLICY.original is None:
        _POLICY.original = torch.get_num_threads()
    if isinstance(setting, int):
        torch.set_num_threads(setting)
    elif setting == "auto":
        _POLICY.ceiling = min(_POLICY.original, len(usable_cores()))
        adapt()


def adapt(work: int | None = None, stage: str = "the run") -> int | None:
    """Under threads=auto, torch's thread count for a stage whose step touches `work` elements, chosen
    now (choose_threads) and set; the count, or None under any other setting."""
    if _POLICY.setting != "auto":
        return None
    cores = usable_cores()
    if _POLICY.ceiling <= 1:  # nothing to choose (one core, or OMP_NUM_THREADS=1): no sample taken
        chosen = 1
    else:
        now = time.monotonic()
        if _POLICY.sampled is None or now - _POLICY.sampled[0] > RESAMPLE_AFTER:
            _POLICY.sampled = (now, busy_cores(cores))
        chosen = min(_POLICY.ceiling, choose_threads(len(cores), _POLICY.sampled[1], work))
    if chosen != torch.get_num_threads():
        busy = "" if _POLICY.sampled is None else f", other processes keep {_POLICY.sampled[1]:.1f} busy"
        log.info("%s: %d torch thread(s) (%d usable cores%s)", stage, chosen, len(cores), busy)
        torch.set_num_threads(chosen)
    return chosen


class _OneThread:
    """How many sections of this process want one torch thread now, and torch's count before the first."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.depth = 0
        self.before = 1


_ONE = _OneThread()


@contextmanager
def one_thread():
    """torch on one intra-op thread while the section runs, in every thread of the process (the count is
    global), restored when the last such section ends. For work whose parallel parts are short and many
    (relaxation rounds, LAPACK decompositions, problems already solved side by side): each parallel part
    waits for its slowest thread, and beside a busy process that thread waits for a core."""
    with _ONE.lock:
        if _ONE.depth == 0:
            _ONE.before = torch.get_num_threads()
            if _ONE.before != 1:
                torch.set_num_threads(1)
        _ONE.depth += 1
    try:
        yield
    finally:
        with _ONE.lock:
            _ONE.depth -= 1
            if _ONE.depth == 0 and _ONE.before != 1:
                torch.set_num_threads(_ONE.before)
