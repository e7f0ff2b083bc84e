"""Checksums of what a dataset reads (the corpus or images, the tokenizer) for the endpoint cache key
(glmc.pipeline.cache); `data.root` itself is not part of it. Files above `FULL_HASH_BYTES` are summed by
their size and their first and last MiB.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from glmc.config import DataConfig

FULL_HASH_BYTES = 64 << 20
EDGE_BYTES = 1 << 20


def _file_digest(path: Path, size: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        if size <= FULL_HASH_BYTES:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        else:
            h.update(f.read(EDGE_BYTES))
            f.seek(size - EDGE_BYTES)
            h.update(f.read(EDGE_BYTES))
    return h.hexdigest()


@lru_cache(maxsize=64)
def _tree_digest(path: str, listing: tuple[tuple[str, int, int], ...]) -> str:
    # keyed by the listing (names, sizes, modification times): a file changed in place is summed again
    h = hashlib.sha256()
    root = Path(path)
    for relative, size, _ in listing:
        h.update(f"{relative}\0{size}\0".encode())
        h.update(_file_digest(root / relative if relative else root, size).encode())
    return h.hexdigest()


def tree_checksum(path: Path) -> str | None:
    """sha256 over a file or every file below a folder; None where nothing is there."""
    path = Path(path)
    if path.is_file():
        stat = path.stat()
        return _tree_digest(str(path), (("", stat.st_size, stat.st_mtime_ns),))
    if not path.is_dir():
        return None
    files = sorted(p for p in path.rglob("*") if p.is_file())
    listing = tuple((str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns) for p in files)
    return _tree_digest(str(path), listing)


@lru_cache(maxsize=8)
def _embedded_digest(sources: tuple[Callable[[], str | bytes], ...]) -> str:
    h = hashlib.sha256()
    for source in sources:
        content = source()
        h.update(content.encode("utf-8") if isinstance(content, str) else content)
    return h.hexdigest()


def files_checksum(relative: str, cfg: DataConfig) -> str | None:
    """The checksum of `relative` (a file or folder) under data.root; None while it is not there."""
    return tree_checksum(Path(cfg.root) / relative)


def embedded_checksum(sources: tuple[Callable[[], str | bytes], ...], cfg: DataConfig) -> str | None:
    """The checksum of data shipped with Python or a library, from `sources` (functions giving its content)."""
    return _embedded_digest(sources)


def path_checksum(cfg: DataConfig) -> str | None:
    """The checksum of data.path (data=text_file) by content; None while no file is named or there."""
    path = getattr(cfg, "path", None)
    return tree_checksum(Path(path).expanduser()) if path else None


def tokenizer_checksum(cfg: DataConfig) -> str | None:
    """The saved tokenizer's files; a WordPiece trained here: its rules' version; None for char and images."""
    if cfg.get("tokenizer_path") and str(cfg.tokenizer) != "char":
        return tree_checksum(Path(cfg.tokenizer_path))
    if str(cfg.get("tokenizer")) == "wordpiece":  # the rules that train it, so a change of them retrains
        from glmc.data.wordpiece import TRAINER_VERSION

        return f"wordpiece trainer v{TRAINER_VERSION}"
    return None
