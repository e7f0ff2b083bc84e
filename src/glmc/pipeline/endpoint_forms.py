"""A large folder's two forms, built when a stage asks for them instead of held for the whole run.

An endpoint is used as its Hugging Face model (vanilla's path, its own loss, export) and in canonical form
(every other method); holding both for both endpoints is four models before any method runs. From
HOLD_BELOW bytes per model an endpoint holds neither: its Hugging Face model is read from its folder again
(transformers maps the weights: quick) and its canonical form from a file written when the folder was
first converted (a temporary folder, removed with the endpoints or at exit), so a stage holds only what it
uses and lets it go when it ends.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from glmc.host_memory import RELEASE_ABOVE, release_freed
from glmc.models.canonical import CanonicalConfig, CanonicalTransformer

log = logging.getLogger(__name__)

HOLD_BELOW = RELEASE_ABOVE  # a folder's float32 bytes from which its forms are built when asked
# how much of the first batch's logits endpoint_deviation compares (a large vocabulary's: a few examples)
DEVIATION_LOGITS_BYTES = 16 * 2**20


class FolderForms:
    """Builds one folder's Hugging Face model and its canonical form on each call (each a fresh copy)."""

    def __init__(self, folder: Any, spill: tempfile.TemporaryDirectory, canonical: CanonicalTransformer):
        self.folder, self.spill, self.untie = folder, spill, False  # untie: set when the run mixes tied heads
        self.file = Path(spill.name) / f"canonical_{folder.index}.pt"
        self.width = canonical.width
        torch.save({"config": canonical.config.to_dict(), "params": canonical.params()}, self.file)
        log.info("%s: canonical form kept in %s while the run needs it", folder.key, self.file)

    def model(self) -> torch.nn.Module:
        from glmc.pipeline.hf_folders import load_model, untie_head

        model = load_model(self.folder)
        return untie_head(self.folder, model) if self.untie else model

    def keep_logits(self, key: int, logits: torch.Tensor) -> None:
        """Keeps an evaluator's first logits of this model beside its canonical form (not in memory)."""
        torch.save(logits, self.file.with_name(f"logits_{self.folder.index}_{key}.pt"))

    def logits(self, key: int) -> torch.Tensor | None:
        """The logits keep_logits kept under `key`, or None."""
        file = self.file.with_name(f"logits_{self.folder.index}_{key}.pt")
        return torch.load(file, map_location="cpu", weights_only=True) if file.exists() else None

    def canonical(self) -> CanonicalTransformer:
        stored = torch.load(self.file, map_location="cpu", weights_only=True)
        config = CanonicalConfig.from_dict(stored["config"])
        return CanonicalTransformer(config, stored["params"], copy=False)


def holds_forms(folder_bytes: int) -> bool:
    """Whether an endpoint of this many float32 bytes keeps both its forms for the whole run."""
    return folder_bytes < HOLD_BELOW


def folder_forms(folders: list, convert: Callable[[Any], tuple[bool, CanonicalTransformer]]) -> list[FolderForms]:
    """FolderForms of each folder; `convert(folder)` -> (whether its head is tied, its canonical form), one
    folder at a time (its model freed before the next is read); tied heads are untied where the folders
    mix tied and untied ones."""
    spill = tempfile.TemporaryDirectory(prefix="glmc-endpoints-")
    forms, tied = [], []
    for folder in folders:
        is_tied, canonical = convert(folder)
        tied.append(is_tied)
        forms.append(FolderForms(folder, spill, canonical))
        del canonical
        release_freed()
    if any(tied) and not all(tied):
        for form, is_tied in zip(forms, tied):
            form.untie = is_tied
    return forms
