"""Your own text: `data=text_file data.path=/some/file.txt` evaluates on a UTF-8 text file of yours (and
trains on it: endpoints trained here, data-driven matchers), cut as every text dataset is (glmc.data.text):
contiguous train / validation / test blocks by data.val_fraction and data.test_fraction, each cut into
windows of data.seq_len tokens.

The text is read with a saved tokenizer (conf/data/text_file.yaml: data.tokenizer=pretrained): with
endpoints=pretrained the folders' own (the first folder's, or data.tokenizer_path's). Endpoints trained here
from seeds have no tokenizer of their own, so they need data.tokenizer_path=<a folder written by
save_pretrained>, or data.tokenizer=char (one id per character of the file) or data.tokenizer=wordpiece
(trained on its training block) set on purpose: nothing falls back to characters unasked.

Before any work (`text_file_problems`, through the registry's `checks`): a run that names no file, a path
where no file is, and a run with no tokenizer are refused. At load (`text_file_splits`): a file that is not
UTF-8, and one too short for a window in every split. Every message names data.path.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from glmc.data.text import TOKENIZER_FILES, text_splits

if TYPE_CHECKING:
    from glmc.config import Config, DataConfig

ASK = "data=text_file reads your own UTF-8 text file: set data.path=<file> (e.g. data.path=/path/to/notes.txt)"


def _where(path: Path) -> str:
    """How a relative data.path was read: from the folder run.py was started in."""
    return "" if path.is_absolute() else f" (read from {Path.cwd()}, the folder run.py was started in)"


def file_problem(data: Any) -> str | None:
    """Why data.path names no readable file, or None."""
    if not data.path:
        return ASK
    path = Path(str(data.path)).expanduser()
    if not path.exists():
        return f"data.path={data.path}: no such file{_where(path)}; give the UTF-8 text file to evaluate on"
    if not path.is_file():
        return f"data.path={data.path} is not a file (a folder?); give one UTF-8 text file"
    return None


def _tokenizer_problem(cfg: Config) -> str | None:
    """Why no saved tokenizer can read the file (data.tokenizer=pretrained), or None. With endpoints=pretrained
    `cfg` is the config as the data are read: data.tokenizer_path is then the first folder's unless set."""
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
    """What keeps a run of data=text_file from reading its file, found before any work: no data.path, no
    file there, no tokenizer to read it with."""
    found = [file_problem(cfg.data), _tokenizer_problem(cfg)]
    return [p for p in found if p]


def read_text_file(path: Path, key: str) -> str:
    """The file's text without a leading byte-order mark; ValueError naming `key` and the first byte that
    is not UTF-8."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(
            f"{key} is not UTF-8 text: byte {data[err.start]:#04x} at offset {err.start} of {len(data)} "
            f"({err.reason}); convert it to UTF-8 (e.g. iconv -f latin1 -t utf-8)"
        ) from None
    return text.removeprefix("\ufeff")


def text_file_splits(cfg: DataConfig):
    problem = file_problem(cfg)
    if problem:  # the config check names it first; a caller of the loader alone gets the same message
        raise (FileNotFoundError if cfg.path else ValueError)(problem)
    path = Path(str(cfg.path)).expanduser()
    key = f"data.path={cfg.path}"
    return text_splits(cfg, read_text_file(path, key), source=key)
