"""What a folder holding a saved tokenizer must contain, shared by every tokenizer that reads one."""

from __future__ import annotations

import json
from pathlib import Path

RESAVE = "save the tokenizer there again with save_pretrained"
# what save_pretrained writes for a fast tokenizer, or the slow GPT-2 tokenizer's two files
TOKENIZER_FILES = (("tokenizer.json",), ("vocab.json", "merges.txt"))


def error_reason(err: BaseException, limit: int = 200) -> str:
    """An error as one short line for a message: its type and the first `limit` characters of its first line."""
    return f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:limit]}"


def check_tokenizer_folder(path: Path, key: str = "data.tokenizer_path") -> None:
    """ValueError naming the folder when it lacks the tokenizer's files, one of its JSON files does not
    parse, or its tokenizer_config.json asks for code of its own (`auto_map`), which is never run."""
    if not any(all((path / name).is_file() for name in files) for files in TOKENIZER_FILES):
        present = sorted(p.name for p in path.iterdir())
        raise ValueError(
            f"{key}={path} holds no saved tokenizer: it needs tokenizer.json (or vocab.json and "
            f"merges.txt) and holds {present or 'nothing'}; {RESAVE}"
        )
    for file in sorted(path.glob("*.json")):
        try:
            content = json.loads(file.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(
                f"{file} is not valid JSON ({error_reason(err)}): the tokenizer in {key}={path} is damaged; {RESAVE}"
            ) from None
        if file.name == "tokenizer_config.json" and isinstance(content, dict) and content.get("auto_map"):
            raise ValueError(
                f"{key}={path}: its tokenizer_config.json asks for the folder's own code (auto_map), and glmc "
                "never runs code from a model folder; save a tokenizer of the transformers library there"
            )
