"""The embedded text corpus: CPython's help topics (`pydoc_data.topics`), which ship with Python.

About 465,000 characters of English prose and code examples, 103 distinct characters; the topics are
joined in the order of their names, so the corpus is the same on every machine with the same Python.
"""

from __future__ import annotations

from glmc.config import DataConfig
from glmc.data.text import text_splits


def pydoc_text() -> str:
    from pydoc_data.topics import topics

    return "\n\n".join(topics[name] for name in sorted(topics))


def pydoc_splits(cfg: DataConfig):
    return text_splits(cfg, pydoc_text(), source="the pydoc corpus (pydoc_data.topics)")
