"""Tiny Shakespeare: the char-rnn corpus, one plain-text file `<data.root>/tiny_shakespeare/input.txt`
(about 1.1 million characters). `data.download=true` fetches it on a machine with network."""

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


def tiny_shakespeare_splits(cfg: DataConfig):
    return text_splits(cfg, shakespeare_file(cfg).read_text(encoding="utf-8"))
