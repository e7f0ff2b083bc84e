"""Checksums of what a dataset reads: the corpus (or images) and the tokenizer.

They enter the endpoint cache key (glmc.pipeline.cache), so an endpoint trained on one corpus, one
tokenizer or one Python's embedded help text is never reused for another, wherever the files live
(`data.root` itself is not part of the key: the same files in another folder are the same data).

A folder is summed file by file (relative path, size, content). Files above `FULL_HASH_BYTES` are
summed by their size and their first and last MiB, which keeps a multi-gigabyte corpus from costing
minutes per run while any edit that changes the length or either end still changes the sum.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

from glmc.config import DataConfig

FULL_HASH_BYTES = 64 << 20
EDGE_BYTES = 1 << 20

# where each on-disk dataset lives under data.root (the loaders in glmc.data read the same places)
ON_DISK = {
    "tiny_shakespeare": "tiny_shakespeare/input.txt",
    "bookcorpus": "bookcorpus",
    "cifar10": "cifar-10-batches-py",
    "cifar100": "cifar-100-python",
    "tiny_imagenet": "tiny-imagenet-200",
}


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


@lru_cache(maxsize=4)
def _embedded_digest(name: str) -> str:
    h = hashlib.sha256()
    if name in ("pydoc", "pydoc_topics"):
        from glmc.data.pydoc_corpus import pydoc_text

        h.update(pydoc_text().encode("utf-8"))
        if name == "pydoc_topics":  # the labels and the rules that cut the examples are part of the data
            from glmc.data.pydoc_topics import task_definition

            h.update(task_definition().encode("utf-8"))
    else:
        from sklearn.datasets import load_digits

        digits = load_digits()
        h.update(digits.data.astype("float64").tobytes())
        h.update(digits.target.astype("int64").tobytes())
    return h.hexdigest()


def corpus_checksum(cfg: DataConfig) -> str | None:
    """The checksum of the data `cfg` reads; None where its files are not (yet) on disk."""
    name = str(cfg.name)
    if name in ("digits", "pydoc", "pydoc_topics"):
        return _embedded_digest(name)
    if name not in ON_DISK:
        raise ValueError(f"data.name={name!r}: no checksum rule for this dataset")
    return tree_checksum(Path(cfg.root) / ON_DISK[name])


def tokenizer_checksum(cfg: DataConfig) -> str | None:
    """The saved tokenizer's files (data.tokenizer_path); for a WordPiece tokenizer trained here, the
    version of its rules (the corpus and the data.* keys determine the rest); None for the character
    tokenizer, which the corpus itself determines, and for images."""
    if cfg.get("tokenizer_path") and str(cfg.tokenizer) != "char":
        return tree_checksum(Path(cfg.tokenizer_path))
    if str(cfg.get("tokenizer")) == "wordpiece":  # the rules that train it, so a change of them retrains
        from glmc.data.wordpiece import TRAINER_VERSION

        return f"wordpiece trainer v{TRAINER_VERSION}"
    return None


def data_fingerprint(cfg: DataConfig) -> dict[str, str | None]:
    return {"corpus": corpus_checksum(cfg), "tokenizer": tokenizer_checksum(cfg)}
