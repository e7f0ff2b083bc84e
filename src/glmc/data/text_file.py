"""Your own text (`data=text_file data.path=<file>`): a UTF-8 file cut as every text dataset is
(glmc.data.text), read with a saved tokenizer (data.tokenizer_path), or data.tokenizer=char or wordpiece
set on purpose: nothing falls back to characters unasked.

The file is never held whole: a first pass checks the UTF-8 and counts the characters (placing the split
points), a second tokenizes each split in segments of about CHUNK characters into a compact id array. A
segment ends only where the tokenizer reads the text around the cut the same cut or uncut.
"""

from __future__ import annotations

import codecs
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from glmc.data.text import (
    SPLITS,
    CharTokenizer,
    Tokenizer,
    check_task,
    check_task_tokenizer,
    make_tokenizer,
    split_points,
    token_windows,
)
from glmc.data.tokenizer_folder import TOKENIZER_FILES
from glmc.safe_files import symlink_loop

if TYPE_CHECKING:
    from glmc.config import Config, DataConfig

CHUNK = 1 << 16  # bytes read, and about the characters tokenized, at a time
CONTEXT = 64  # characters on each side of a cut whose ids are compared with and without it
TRIES = 8  # cuts tried, from the end of a segment, before the next read

ASK = "data=text_file reads your own UTF-8 text file: set data.path=<file> (e.g. data.path=/path/to/notes.txt)"


def _where(path: Path) -> str:
    return "" if path.is_absolute() else f" (read from {Path.cwd()}, the folder run.py was started in)"


def file_problem(data: Any) -> str | None:
    """Why data.path names no readable file, or None."""
    if not data.path:
        return ASK
    path = Path(str(data.path)).expanduser()
    if symlink_loop(path):  # exists() would call it missing
        return (
            f"data.path={data.path}: a symbolic link on this path leads back to itself (a loop), so the file "
            "cannot be read; remove the link or set data.path=<the text file itself>"
        )
    if not path.exists():
        return f"data.path={data.path}: no such file{_where(path)}; give the UTF-8 text file to evaluate on"
    if not path.is_file():
        return f"data.path={data.path} is not a file (a folder?); give one UTF-8 text file"
    return None


def _tokenizer_problem(cfg: Config) -> str | None:
    """Why no saved tokenizer can read the file (data.tokenizer=pretrained), or None."""
    data = cfg.data
    if str(data.tokenizer) != "pretrained":  # char or wordpiece on purpose, gpt2 reads its own setting
        return None
    if not data.tokenizer_path:
        return (
            f"data=text_file reads data.path={data.path} with a saved tokenizer, and none is given: endpoints "
            "trained here from seeds need data.tokenizer_path=<a folder written by save_pretrained> (the tokenizer "
            "the text is to be read with, e.g. that of the models you will compare them with), or data.tokenizer="
            "char on purpose for one id per character of the file (data.tokenizer=wordpiece: a vocabulary trained "
            "on its training block)"
        )
    folder = Path(str(data.tokenizer_path)).expanduser()
    if not folder.is_dir() or any(all((folder / n).is_file() for n in files) for files in TOKENIZER_FILES):
        return None  # a missing folder is named where it is read (the folder checks, the tokenizer's loader)
    paths = list(cfg.endpoints.paths) if str(cfg.endpoints.source) == "pretrained" else []
    first = paths and Path(str(paths[0])).expanduser().resolve() == folder.resolve()
    named = f"endpoints.paths[0]={paths[0]}" if first else f"data.tokenizer_path={data.tokenizer_path}"
    return (
        f"data=text_file reads data.path={data.path} with the tokenizer saved in {named}, which holds none "
        "(tokenizer.json, or vocab.json and merges.txt): save the tokenizer the models were trained with there "
        "(tokenizer.save_pretrained(<folder>)), or name a folder that holds it with data.tokenizer_path=<folder>"
    )


def text_file_problems(cfg: Config) -> list[str]:
    """What keeps data=text_file from reading its file: no data.path, no file there, no tokenizer."""
    found = [file_problem(cfg.data), _tokenizer_problem(cfg)]
    return [p for p in found if p]


def _decoded(path: Path, key: str, chunk: int) -> Iterator[str]:
    """The file's text in pieces of up to `chunk` bytes, without a byte-order mark; UTF-8 checked."""
    decoder, read, first = codecs.getincrementaldecoder("utf-8")(), 0, True
    with path.open("rb") as f:
        while True:
            data = f.read(chunk)
            held = len(decoder.getstate()[0])  # bytes of a character the last read cut
            try:
                text = decoder.decode(data, final=not data)
            except UnicodeDecodeError as err:
                at = read - held + err.start
                raise ValueError(
                    f"{key} is not UTF-8 text: byte {err.object[err.start]:#04x} at offset {at} of "
                    f"{path.stat().st_size} ({err.reason}); convert it to UTF-8 (e.g. iconv -f latin1 -t utf-8)"
                ) from None
            read += len(data)
            if first and text:
                text, first = text.removeprefix("\ufeff"), False
            if text:
                yield text
            if not data:
                return


def _scan(path: Path, key: str, chunk: int, chars: bool) -> tuple[int, set[str]]:
    """(the file's characters, the set of them where `chars`, else an empty set), UTF-8 checked."""
    n, seen = 0, set()
    for text in _decoded(path, key, chunk):
        n += len(text)
        if chars:
            seen.update(text)
    return n, seen


def _block_pieces(path: Path, key: str, chunk: int, points: tuple[int, int]) -> Iterator[tuple[int, str]]:
    """(split index, text) pieces of the file, cut at the split points (character offsets)."""
    start = 0  # the offset of the piece's first character
    for text in _decoded(path, key, chunk):
        while text:
            block = sum(start >= p for p in points)  # the split `start` lies in
            take = len(text) if block == len(points) else min(len(text), points[block] - start)
            yield block, text[:take]
            text, start = text[take:], start + take


WHITESPACE_CUT = re.compile(r"(?<=\S)\s")  # a whitespace run begins


def _cut(text: str, chunk: int, cuttable: Callable[[str, int], bool]) -> int | None:
    """A cut in the last `chunk` characters that `cuttable` accepts (whitespace starts first), or None."""
    lo, hi = max(len(text) - chunk, CONTEXT), len(text) - CONTEXT
    starts = [m.start() for m in WHITESPACE_CUT.finditer(text, lo, hi)][-TRIES:] if hi > lo else []
    spaced = [hi - k * max((hi - lo) // TRIES, 1) for k in range(TRIES)]
    for p in [*reversed(starts), *spaced]:
        if lo <= p < hi and cuttable(text, p):
            return p
    return None


def _segments(pieces: Iterable[tuple[int, str]], chunk: int, cuttable) -> Iterator[tuple[int, str]]:
    """(split index, text) segments of about `chunk` to 2 * `chunk` characters where `cuttable` allows."""
    pending, current = "", 0
    for block, text in pieces:
        if block != current:
            yield current, pending
            pending, current = "", block
        pending += text
        if len(pending) >= 2 * chunk and (cut := _cut(pending, chunk, cuttable)) is not None:
            yield current, pending[:cut]
            pending = pending[cut:]
    yield current, pending


def _transparent(tokenizer: Tokenizer) -> Callable[[str, int], bool]:
    """Whether the tokenizer reads the CONTEXT characters on each side of a cut alike cut or uncut."""

    def cuttable(text: str, p: int) -> bool:
        left, right = text[p - CONTEXT : p], text[p : p + CONTEXT]
        return list(tokenizer.encode(left + right)) == [*tokenizer.encode(left), *tokenizer.encode(right)]

    return cuttable


def _whitespace_cut(text: str, p: int) -> bool:
    return text[p].isspace() and not text[p - 1].isspace()


def id_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned or signed dtype that holds every id below `vocab_size`."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.int32)


def read_token_ids(path: Path, key: str, tokenizer: Tokenizer, points, chunk: int = CHUNK) -> list[np.ndarray]:
    """The three splits' ids (cut at the character offsets `points`) as compact arrays."""
    dtype = id_dtype(tokenizer.vocab_size)
    parts: list[list[np.ndarray]] = [[] for _ in SPLITS]
    for block, text in _segments(_block_pieces(path, key, chunk, points), chunk, _transparent(tokenizer)):
        parts[block].append(np.asarray(tokenizer.encode(text), dtype=dtype))
    return [np.concatenate(p) if p else np.zeros(0, dtype) for p in parts]


def _training_word_counts(path: Path, key: str, points, chunk: int) -> Counter:
    """WordPiece's word counts of the training split, by segments cut before whitespace (words hold none)."""
    from glmc.data.wordpiece import word_counts

    counts: Counter = Counter()
    for block, text in _segments(_block_pieces(path, key, chunk, points), chunk, _whitespace_cut):
        if block:
            break
        counts.update(word_counts(text))
    return counts


def _tokenizer(cfg: DataConfig, path: Path, key: str, points, chars: set[str], chunk: int) -> Tokenizer:
    """The tokenizer data.tokenizer names (char and a trained WordPiece from the file itself)."""
    if cfg.tokenizer == "char":
        return CharTokenizer("".join(sorted(chars)))
    if cfg.tokenizer == "wordpiece" and not cfg.tokenizer_path:
        from glmc.data.wordpiece import WordPieceTokenizer, build_tokenizer, learn_vocabulary

        counts = _training_word_counts(path, key, points, chunk)
        return WordPieceTokenizer(build_tokenizer(learn_vocabulary(counts, int(cfg.tokenizer_vocab))))
    return make_tokenizer(cfg, "")


def text_file_splits(cfg: DataConfig, chunk: int = CHUNK):
    problem = file_problem(cfg)
    if problem:  # the config check names it first; a caller of the loader alone gets the same message
        raise (FileNotFoundError if cfg.path else ValueError)(problem)
    path = Path(str(cfg.path)).expanduser()
    key = f"data.path={cfg.path}"
    n, chars = _scan(path, key, chunk, chars=cfg.tokenizer == "char")
    check_task(cfg, key, n)
    points = split_points(n, cfg.val_fraction, cfg.test_fraction)
    tokenizer = _tokenizer(cfg, path, key, points, chars, chunk)
    check_task_tokenizer(cfg, tokenizer)
    ids = read_token_ids(path, key, tokenizer, points, chunk)
    bounds = (0, *points, n)
    sets = []
    for i, name in enumerate(SPLITS):
        tokens = torch.from_numpy(ids[i]).long()
        ids[i] = None  # the compact copy goes as soon as the windows hold the ids
        sets.append(token_windows(cfg, tokenizer, name, tokens, (n, bounds[i + 1] - bounds[i]), key))
    return sets[0], sets[1], sets[2], tokenizer
