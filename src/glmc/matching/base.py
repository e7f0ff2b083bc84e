"""The matcher interface: every alignment method, pairwise or multi-model, sits behind it.

A matcher maps (canonical A, canonical B, context) to an Alignment. It never evaluates a path:
barriers, curves and result files are the pipeline's (glmc.eval.evaluator).
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from glmc.alignment import Alignment
from glmc.models.canonical import CanonicalTransformer


@dataclass
class MatchContext:
    """What a data-driven matcher may need beyond its settings, never the whole run config.

    data: training batches (a DataLoader or LightningDataModule); trainer: a Lightning Trainer factory;
    logger: stage name -> Lightning logger; run_dir: where the method may write; device: where its tensor
    work runs; fit (glmc.train.latent_fit.fit_latents) and path_loss (glmc.eval.evaluator.path_losses):
    passed in by the caller, so that matching never imports the training or evaluation code."""

    data: Any = None
    trainer: Callable[..., Any] | None = None
    logger: Callable[[str], Any] | None = None
    run_dir: Path = Path("outputs/match")
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    fit: Callable[..., tuple[float, int, Path | None]] | None = None
    path_loss: Callable[..., dict[str, list[float]]] | None = None
    # the endpoints are large folders held one form at a time: B is the caller's own copy (the matcher may
    # transform it in place, so the aligned B is not held beside it) and the search holds as little as it can
    lean_memory: bool = False
    _token_ids: torch.Tensor | None = field(default=None, repr=False)

    def require(self, name: str, method: str) -> Callable[..., Any]:
        """The callable `name` (fit, path_loss), or an error that says where to get it."""
        value = getattr(self, name)
        if value is None:
            where = {"fit": "glmc.train.latent_fit.fit_latents", "path_loss": "glmc.eval.evaluator.path_losses"}
            raise ValueError(f"{method} needs context.{name}: pass {name}={where[name]} to MatchContext")
        return value

    def train_batches(self, method: str) -> Iterable:
        if self.data is None:
            raise ValueError(f"{method} learns from data: pass data=<training DataLoader> (context.data is None)")
        return self.data.train_dataloader() if hasattr(self.data, "train_dataloader") else self.data

    def validation_batches(self, method: str, fallback_batches: int = 8) -> Iterable:
        """Held-out batches for choices a method makes on data: the DataModule's validation split,
        or the first training batches where there is none (never the test split)."""
        if getattr(self.data, "has_validation_split", False):
            return self.data.val_dataloader()
        return list(itertools.islice(iter(self.train_batches(method)), fallback_batches))

    def token_ids(self, vocab_size: int, inputs: bool = False) -> torch.Tensor:
        """The token ids that occur as targets in the training data (text only), sorted; with `inputs`,
        also those that occur as inputs (masked-LM targets are the masked positions only)."""
        if self._token_ids is None:
            counts = torch.zeros(vocab_size, dtype=torch.long)
            for batch_inputs, targets in self.train_batches("vocabulary restriction"):
                ids = torch.cat([targets.flatten(), batch_inputs.flatten()]) if inputs else targets.flatten()
                ids = ids[ids >= 0]  # padding targets are negative
                counts += torch.bincount(ids, minlength=vocab_size)[:vocab_size]
            self._token_ids = counts.nonzero().flatten()
        return self._token_ids

    def fit_data(self) -> dict[str, Any]:
        """Trainer.fit's data argument: a DataModule is handed over as one (each spawned rank builds
        its own loaders), a plain loader as train_dataloaders."""
        import lightning as L

        if isinstance(self.data, L.LightningDataModule):
            return {"datamodule": self.data}
        if isinstance(self.data, (list, tuple)):  # Lightning reads a list as several loaders, not as batches
            return {"train_dataloaders": BatchList(self.data)}
        return {"train_dataloaders": self.data}


class BatchList:
    """A list of batches as one loader, which Lightning reads again at every epoch."""

    def __init__(self, batches: list | tuple):
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


class Matcher(Protocol):
    """The matcher interface: every registered matcher subclasses it, as must a class that a config's
    `_target_` names (glmc.matching.registry checks both alike)."""

    name: str
    # whether the method interpolates the models as given (vanilla) and so never reads their canonical forms
    interpolates_originals: bool = False

    def match(self, a: CanonicalTransformer, b: CanonicalTransformer, context: MatchContext) -> Alignment: ...


def require_factored(method: str, *models: torch.nn.Module) -> None:
    for m in models:
        if not isinstance(m, CanonicalTransformer):
            raise TypeError(f"{method} takes canonical models: convert with glmc.to_canonical, got {type(m).__name__}")
        if m.config.form != "factored":
            raise ValueError(f"{method} transforms factored heads: pass models before .to_circuit()")


def circuit_pairs(qk: str, vo: str) -> tuple[str, ...]:
    """The symmetry config's head forms -> the pairs interpolated as circuits."""
    return tuple(name for name, form in (("qk", qk), ("vo", vo)) if form == "circuit")


def settings_hash(settings: dict[str, Any], *models: torch.nn.Module) -> str:
    """Short hash of a method's settings and its endpoints' parameters: names a checkpoint folder, so
    a rerun with other settings or other endpoints never resumes from a stale one."""
    h = hashlib.sha1(json.dumps(settings, sort_keys=True, default=str).encode())
    for model in models:
        for name, t in sorted(model.state_dict().items()):
            h.update(name.encode())
            h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:12]
