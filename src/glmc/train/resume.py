"""Endpoint training that survives a kill: `last.ckpt` after every epoch, and a resume that continues
exactly where the uninterrupted run would be.

A Lightning checkpoint holds the weights, optimiser, scheduler and loop counters, but not the random
number generators. `EpochCheckpoint` adds them (torch, CUDA, numpy, Python, and the generator that
shuffles the training loader) to its own state in the checkpoint and puts them back when training
resumes: the loader's generator before the loader's first iterator draws from it, the global ones at
the start of the first resumed epoch. It also carries the early-stopping decision of the last epoch.
The file is written beside its place and renamed, so a kill while writing leaves the previous one.
"""

from __future__ import annotations

import os
import pickle
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch.callbacks import Checkpoint

from glmc.safe_files import move_aside


def _numpy_state() -> list[Any]:
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return [name, [int(k) for k in keys], int(pos), int(has_gauss), float(cached)]  # plain data: weights_only loads


def _set_numpy_state(state: list[Any]) -> None:
    name, keys, pos, has_gauss, cached = state
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))


def _python_state() -> list[Any]:
    version, internal, gauss = random.getstate()
    return [version, list(internal), gauss]


def _set_python_state(state: list[Any]) -> None:
    version, internal, gauss = state
    random.setstate((version, tuple(internal), gauss))


class EpochCheckpoint(Checkpoint):
    """Writes `path` at the end of every training epoch; restores the random state on resume.

    `data` is the DataModule (glmc.data.module) whose training loader is shuffled by a generator: its
    state is saved from the trainer's loader and handed back through `data.train_generator_state`.
    A Checkpoint subclass, so Lightning runs it after the other callbacks (early stopping included)."""

    def __init__(self, path: Path, data: Any = None):
        self.path = Path(path)
        self.data = data
        self._pending: dict[str, Any] | None = None
        self._should_stop = False
        self._loader_state: torch.Tensor | None = None

    def state_dict(self) -> dict[str, Any]:
        return {
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
            "numpy": _numpy_state(),
            "python": _python_state(),
            "loader": self._loader_state,
            "should_stop": self._should_stop,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pending = dict(state_dict)
        if self.data is not None and state_dict.get("loader") is not None:
            self.data.train_generator_state = state_dict["loader"]  # applied when the loader is built

    def on_train_start(self, trainer, pl_module) -> None:
        if self._pending and self._pending.get("should_stop"):
            trainer.should_stop = True  # early stopping had ended the run before the kill

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        state, self._pending = self._pending, None
        if not state:
            return
        torch.set_rng_state(state["torch"])
        if state["cuda"] and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(state["cuda"])
        _set_numpy_state(state["numpy"])
        _set_python_state(state["python"])

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._should_stop = bool(trainer.should_stop)
        generator = getattr(trainer.train_dataloader, "generator", None)
        self._loader_state = None if generator is None else generator.get_state()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        trainer.save_checkpoint(tmp, weights_only=False)  # every rank calls it; rank 0 writes
        if trainer.is_global_zero:
            os.replace(tmp, self.path)


def resumable(last: Path) -> Path | None:
    """`last` if it exists and loads as a checkpoint of tensors and plain data; a damaged one (a run
    killed while writing it, a full disk) is moved aside with a warning, so the rerun starts afresh
    instead of failing in Lightning's restore."""
    if not last.exists():
        return None
    try:
        torch.load(last, map_location="cpu", weights_only=True)
    except (OSError, EOFError, RuntimeError, ValueError, pickle.UnpicklingError) as err:
        reason = f"cannot be resumed from ({type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]})"
        try:
            move_aside(last, reason)
        except FileNotFoundError:  # another rank moved it first
            pass
        return None
    return last
