"""Freed host memory handed back to the system after a stage that dropped model-sized temporaries.

glibc keeps the pages of freed blocks below its mmap threshold, and that threshold rises (to 32 MiB) as
large blocks are freed, so a model's layer-sized tensors come from the heap: converting a folder's model
or a matcher's working set leaves as much again resident after they are gone (converting a
Pythia-160M-shaped folder: 0.96 GiB beside the 0.60 GiB model). `release_freed` returns those pages
(malloc_trim) where the C library is glibc, and does nothing elsewhere; callers use it only for models of
RELEASE_ABOVE bytes or more, where the pages matter and its cost (a garbage collection) does not.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
from collections.abc import Iterable, Iterator

from torch import Tensor

RELEASE_ABOVE = 256 * 2**20  # bytes of model tensors from which a stage's end hands freed pages back
M_MMAP_MAX, MMAP_MAX_DEFAULT = -4, 65536  # glibc's mallopt parameters and their defaults
M_TRIM_THRESHOLD, TRIM_THRESHOLD_DEFAULT = -1, 128 * 2**10
KEEP_HEAP_TOP = 2**30  # trim threshold while a fit holds its blocks: freed pages at the heap's top stay mapped


@functools.cache
def _glibc(name: str):
    try:
        return getattr(ctypes.CDLL("libc.so.6"), name)
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to tune or hand back this way
        return None


def _malloc_trim():
    return _glibc("malloc_trim")


@contextlib.contextmanager
def large_blocks_from_heap() -> Iterator[None]:
    """Blocks above glibc's mmap threshold (32 MiB at most) taken from the heap while inside, and the heap's
    freed top kept (not trimmed) until leaving, when freed pages are handed back. glibc maps each such block
    afresh and unmaps it when freed, and gives a freed heap top back past 128 KiB, so the next step's blocks
    fault in their pages anew: a stacked ensemble's activations are K members' at once, and 8 text GPT-2s'
    (67 MB tensors) spent half their step so (3.9 s against 1.9 s); 8 digits ViTs took 10 % longer a step
    with the heap's top trimmed (27,000 page faults a step against 830). Nothing changes where it is not
    glibc."""
    mallopt = _glibc("mallopt")
    if mallopt is None:
        yield
        return
    mallopt(M_MMAP_MAX, 0)
    mallopt(M_TRIM_THRESHOLD, KEEP_HEAP_TOP)
    try:
        yield
    finally:
        mallopt(M_MMAP_MAX, MMAP_MAX_DEFAULT)
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_DEFAULT)
        trim_heap()


def tensor_bytes(tensors: Iterable[Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def release_freed() -> bool:
    """Collect garbage and hand the C heap's free pages back to the system; False where that is not glibc."""
    gc.collect()
    return trim_heap()


def trim_heap() -> bool:
    """The C heap's free pages handed back without a garbage collection (cheap enough between the steps of
    a large search, whose temporaries are freed when each step returns); False where that is not glibc."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def release_after(tensors: Iterable[Tensor]) -> bool:
    """release_freed() where `tensors` (a stage's models) hold RELEASE_ABOVE bytes or more; else nothing."""
    return tensor_bytes(tensors) >= RELEASE_ABOVE and release_freed()
