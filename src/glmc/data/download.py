"""One clear error for a failed download (`data.download=true` without network, a moved URL, ...)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from glmc.data.tokenizer_folder import error_reason


class DownloadError(RuntimeError):
    """A dataset or tokenizer could not be fetched; the message says what to place where instead."""


@contextmanager
def fetching(what: str, source: str, instead: str) -> Iterator[None]:
    """Turn any failure inside the block into a DownloadError naming `what`, `source` and `instead`."""
    try:
        yield
    except Exception as err:
        raise DownloadError(
            f"data.download=true: could not download {what} from {source} ({error_reason(err, 300)}); "
            f"without network, {instead}"
        ) from None
