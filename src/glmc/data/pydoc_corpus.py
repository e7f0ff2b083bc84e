"""The embedded text corpus: CPython's help topics (`pydoc_data.topics`) joined in name order."""

from __future__ import annotations

from glmc.config import DataConfig
from glmc.data.text import text_splits


def pydoc_text() -> str:
    from pydoc_data.topics import topics

    return "\n\n".join(topics[name] for name in sorted(topics))


def pydoc_splits(cfg: DataConfig):
    return text_splits(cfg, pydoc_text(), source="the pydoc corpus (pydoc_data.topics)")
