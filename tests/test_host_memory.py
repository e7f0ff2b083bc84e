"""glmc.host_memory.large_blocks_from_heap: inside it a block above glibc's mmap threshold comes from the
heap (no fresh mapping whose pages fault in again); outside it, and after it, glibc maps such a block."""

from __future__ import annotations

import ctypes

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


@pytest.mark.skipif(host_memory._glibc("mallinfo2") is None, reason="glibc 2.33+ only: the C library tuned")
def test_freed_heap_top_is_kept_inside_and_handed_back_after():
    mallinfo2 = host_memory._glibc("mallinfo2")
    mallinfo2.restype = _MallInfo2
    with host_memory.large_blocks_from_heap():
        before = mallinfo2()
        block = torch.empty(before.fordblks + BLOCK, dtype=torch.uint8)
        grown = mallinfo2().arena
        assert grown >= before.arena + BLOCK  # from the heap: it grew by the block
        del block
        assert mallinfo2().arena == grown  # freed at the top, not trimmed: the next step's block is mapped already
    assert mallinfo2().arena <= grown - BLOCK  # handed back on leaving
