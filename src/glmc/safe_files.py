"""Safe file handling: atomic writes (a temporary file renamed into place, so a reader sees the old file or the
new one, never half of one), damaged files moved aside to `<name>.corrupt-<timestamp>` with a warning, and why a folder
cannot be written (a link loop, a file on the way, no permission)."""

from __future__ import annotations

import errno
import os
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


def current_umask() -> int:
    """The process's umask, read without changing it where Linux shows it (another thread may race)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path beside `path` (same suffix) that replaces `path` when the block exits normally."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.tmp-", suffix=path.suffix, dir=path.parent)
    os.fchmod(fd, 0o666 & ~current_umask())  # mkstemp's 0600 would hide results from the user's group
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write(path: Path, write: Callable[[Path], object]) -> Path:
    """`write(tmp)` fills a temporary file, which then replaces `path` in one rename."""
    with atomic_path(path) as tmp:
        write(tmp)
    return Path(path)


def atomic_write_text(path: Path, text: str) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_text(text))


def move_aside(path: Path, reason: str) -> Path:
    """Rename `path` to `<path>.corrupt-<timestamp>` and warn why; returns the new path."""
    path = Path(path)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while target.exists():  # two in the same second
        target = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
        n += 1
    os.replace(path, target)
    warnings.warn(f"{path} {reason}: moved it aside to {target.name}", RuntimeWarning, stacklevel=2)
    return target


def symlink_loop(path: str | Path) -> bool:
    """Whether `path`, or a folder on the way to it, is a symbolic link that leads back to itself."""
    try:
        os.stat(Path(path).expanduser())
    except OSError as err:
        return err.errno == errno.ELOOP
    return False


def unwritable(path: Path) -> tuple[str, Path, str] | None:
    """Why folder `path` cannot be created or written: ("loop" | "file" | "denied", the nearest existing
    path, the system's reason), or None."""
    if symlink_loop(path):  # exists() would read a loop as "missing"
        return "loop", path, ""
    existing = path
    while not existing.exists() and existing != existing.parent:  # the folder is created below this one
        existing = existing.parent
    if not existing.is_dir():
        return "file", existing, ""
    try:
        with tempfile.TemporaryFile(dir=existing, prefix=".glmc-write-probe-"):
            pass
    except OSError as err:
        return "denied", existing, str(err.strerror or err)
    return None
