"""One clear error for a failed download (`data.download=true` without network, a moved URL, ...)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class DownloadError(RuntimeError):
    """A dataset or tokenizer could not be fetched; the message says what to place where instead."""


@contextmanager
def fetching(what: str, source: str, instead: str) -> Iterator[None]:
    """Turn any failure inside the block into a DownloadError naming `what`, `source` and `instead`
    (what to do without network), with the original error's type and first line."""
    try:
        yield
    except Exception as err:
        reason = (str(err).strip().splitlines() or [""])[0][:300]
        raise DownloadError(
            f"data.download=true: could not download {what} from {source} ({type(err).__name__}: {reason}); "
            f"without network, {instead}"
        ) from None
