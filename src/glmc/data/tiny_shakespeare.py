"""Tiny Shakespeare: the char-rnn corpus, `<data.root>/tiny_shakespeare/input.txt` (data.download=true fetches it)."""

from __future__ import annotations

import urllib.request
from pathlib import Path

from glmc.config import DataConfig
from glmc.data.download import DownloadError, fetching
from glmc.data.text import text_splits

URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"


def shakespeare_file(cfg: DataConfig) -> Path:
    path = Path(cfg.root) / "tiny_shakespeare" / "input.txt"
    if not path.is_file():
        if not cfg.download:
            raise FileNotFoundError(
                f"{path} is missing: set data.root to the folder holding tiny_shakespeare/input.txt "
                "or data.download=true on a machine with network"
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".part")
        instead = f"place the corpus at {path} (data.root={cfg.root}) and set data.download=false"
        try:
            with fetching("Tiny Shakespeare", URL, instead):
                urllib.request.urlretrieve(URL, partial)
        except DownloadError:
            partial.unlink(missing_ok=True)
            raise
        partial.rename(path)  # a broken download never looks like the corpus
    return path


def read_corpus(path: Path) -> str:
    """The file's text; a ValueError naming the file and the first bad byte when it is not UTF-8."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(
            f"{path} is not UTF-8 text: byte {data[err.start]:#04x} at offset {err.start} of {len(data)} "
            f"({err.reason}); replace it with the corpus from {URL} or convert it to UTF-8"
        ) from None


def tiny_shakespeare_splits(cfg: DataConfig):
    path = shakespeare_file(cfg)
    return text_splits(cfg, read_corpus(path), source=str(path))
