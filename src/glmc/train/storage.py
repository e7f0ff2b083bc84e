"""Writes that fail for want of room (a full disk, a quota, a read-only file system): `no_room_error` turns the
system's error into a `NoRoomError` refusal naming the folder, the room needed and free, and what to do."""

from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path

import torch

NO_ROOM = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}
OS_ERROR_TEXT = re.compile(r"os error (\d+)")  # how safetensors reports the system's error


class NoRoomError(OSError):
    """A checkpoint or cache entry could not be written for want of room; the message says where and what to do."""


def no_room_errno(err: BaseException) -> int | None:
    """The errno of `err` when it says there is no room to write (also in a SafetensorError's text)."""
    if isinstance(err, OSError):
        code = err.errno
    else:
        found = OS_ERROR_TEXT.search(str(err))
        code = int(found.group(1)) if found else None
    return code if code in NO_ROOM else None


def state_bytes(module: torch.nn.Module) -> int:
    """The bytes of `module`'s parameters and buffers: the size of its weights file."""
    return sum(t.numel() * t.element_size() for t in module.state_dict().values() if isinstance(t, torch.Tensor))


def checkpoint_bytes(module: torch.nn.Module) -> int:
    """About the size of a training checkpoint of `module`: its weights, Adam's moments, some KiB."""
    return 3 * state_bytes(module) + (64 << 10)


def _size(n: int | None) -> str:
    if n is None:
        return "an unknown amount"
    if n < 1024:
        return f"{n} bytes"
    size, unit = n / 1024, "KiB"
    for larger in ("MiB", "GiB"):
        if size < 1024:
            break
        size, unit = size / 1024, larger
    return f"{size:.1f} {unit}"


def _free(folder: Path) -> int | None:
    """Free bytes on the disk holding `folder` (its nearest existing parent), None where unknown."""
    for place in (folder, *folder.parents):
        try:
            return shutil.disk_usage(place).free
        except OSError:
            continue
    return None


def no_room_error(
    err: BaseException, what: str, folder: Path, needed: int, setting: str = "cache_dir"
) -> NoRoomError | None:
    """The refusal to raise when `err` says there is no room to write `what` into `folder` (else None); call
    it before removing the partial file, so that the free space it reports is what the write met."""
    code = no_room_errno(err)
    if code is None:
        return None
    folder = Path(folder)
    todo = "make it writable" if code == errno.EROFS else "free space on that disk"
    return NoRoomError(
        f"could not write {what} into {folder}: {os.strerror(code)} (about {_size(needed)} needed, "
        f"{_size(_free(folder))} free there); {todo}, or set {setting} to a folder on a disk with room, "
        "then run the same command again (what was written before is kept)"
    )
