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


def _mapped_bytes_while_holding(nbytes: int) -> int:
    """Bytes glibc holds in mapped blocks while a tensor of `nbytes` is alive, beyond those before it."""
    mallinfo2 = host_memory._glibc("mallinfo2")
    mallinfo2.restype = _MallInfo2
    before = mallinfo2().hblkhd
    block = torch.empty(nbytes, dtype=torch.uint8)
    held = mallinfo2().hblkhd - before
    del block
    return held


@pytest.mark.skipif(host_memory._glibc("mallinfo2") is None, reason="glibc 2.33+ only: the C library tuned")
def test_large_blocks_come_from_the_heap_only_inside():
    assert _mapped_bytes_while_holding(BLOCK) >= BLOCK
    with host_memory.large_blocks_from_heap():
        assert _mapped_bytes_while_holding(BLOCK) == 0
    assert _mapped_bytes_while_holding(BLOCK) >= BLOCK  # glibc's default is back
