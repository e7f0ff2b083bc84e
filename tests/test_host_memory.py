"""glmc.host_memory.large_blocks_from_heap: inside it a block above glibc's mmap threshold comes from the
heap (no fresh mapping whose pages fault in again) and a freed block's pages stay mapped for the next;
outside it, and after it, glibc maps such a block, and leaving hands the freed pages back."""

from __future__ import annotations

import ctypes
import os
import resource
from pathlib import Path

import pytest
import torch

from glmc import host_memory

BLOCK = 64 * 2**20  # above glibc's largest mmap threshold (32 MiB)


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _mapped_bytes_while_holding() -> tuple[int, int]:
    """(bytes asked, bytes glibc newly holds in mapped blocks while they are alive): a block larger than
    all the heap's free bytes, which no free chunk there can serve."""
    mallinfo2 = host_memory._glibc("mallinfo2")
    mallinfo2.restype = _MallInfo2
    before = mallinfo2()
    nbytes = before.fordblks + BLOCK
    block = torch.empty(nbytes, dtype=torch.uint8)  # never written: its pages are not touched
    held = mallinfo2().hblkhd - before.hblkhd
    del block
    return nbytes, held


@pytest.mark.skipif(host_memory._glibc("mallinfo2") is None, reason="glibc 2.33+ only: the C library tuned")
def test_large_blocks_come_from_the_heap_only_inside():
    asked, mapped = _mapped_bytes_while_holding()
    assert mapped >= asked
    with host_memory.large_blocks_from_heap():
        assert _mapped_bytes_while_holding()[1] == 0
    asked, mapped = _mapped_bytes_while_holding()
    assert mapped >= asked  # glibc's default is back


def _resident_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


@pytest.mark.skipif(host_memory._glibc("mallinfo2") is None, reason="glibc 2.33+ only: the C library tuned")
def test_freed_blocks_stay_mapped_inside_and_are_handed_back_after():
    mallinfo2 = host_memory._glibc("mallinfo2")
    mallinfo2.restype = _MallInfo2
    pages = BLOCK // os.sysconf("SC_PAGE_SIZE")
    with host_memory.large_blocks_from_heap():
        size = mallinfo2().fordblks + BLOCK  # more than any free chunk: from the heap's top
        torch.empty(size, dtype=torch.uint8)[-BLOCK:].fill_(1)  # written, then freed
        faults = _minor_faults()
        # the next step's block: a little smaller, it fits where the first was, its tail on the written pages
        torch.empty(size - 2 * 2**20, dtype=torch.uint8)[-BLOCK // 2 :].fill_(1)
        refaulted = _minor_faults() - faults
        held = _resident_bytes()
    assert refaulted < pages // 20  # its pages were still mapped (trimmed, each would fault in again)
    assert _resident_bytes() <= held - BLOCK // 2  # handed back on leaving


def test_glibc_is_told_to_keep_the_heap_top_inside_and_set_back_after(monkeypatch):
    calls = []
    library = {"mallopt": lambda param, value: calls.append((param, value)) or 1, "malloc_trim": lambda pad: 1}
    monkeypatch.setattr(host_memory, "_glibc", library.get)
    with host_memory.large_blocks_from_heap():
        inside = list(calls)
    assert inside == [(host_memory.M_MMAP_MAX, 0), (host_memory.M_TRIM_THRESHOLD, host_memory.KEEP_HEAP_TOP)]
    assert calls[2:] == [
        (host_memory.M_MMAP_MAX, host_memory.MMAP_MAX_DEFAULT),
        (host_memory.M_TRIM_THRESHOLD, host_memory.TRIM_THRESHOLD_DEFAULT),
    ]
