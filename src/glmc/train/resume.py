"""Endpoint training that survives a kill: `last.ckpt` after every epoch, with the random states Lightning leaves
out (torch, CUDA, numpy, Python, the loader's generator) and the early-stopping decision, so a resumed run
continues exactly; written beside its place and renamed, and a full disk is a refusal (glmc.train.storage)."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch.callbacks import Checkpoint

from glmc.safe_files import current_umask, move_aside
from glmc.train.storage import checkpoint_bytes, no_room_error


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
    """Writes `path` after every training epoch (after the other callbacks) and restores the random state on
    resume; `setting` (what chooses the folder) is named when the disk has no room."""

    def __init__(self, path: Path, data: Any = None, setting: str = "cache_dir"):
        self.path = Path(path)
        self.data = data
        self.setting = setting
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
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            trainer.save_checkpoint(tmp, weights_only=False)  # every rank calls it; rank 0 writes
            if trainer.is_global_zero:
                os.chmod(tmp, 0o666 & ~current_umask())  # the user's file mode, whoever created the file
                os.replace(tmp, self.path)
        except OSError as err:
            needed = self.path.stat().st_size if self.path.exists() else checkpoint_bytes(pl_module)
            refusal = no_room_error(err, "the training checkpoint", self.path.parent, needed, self.setting)
            tmp.unlink(missing_ok=True)  # a partial file: the previous last.ckpt stays the one to resume from
            if refusal is not None:
                raise refusal from err
            raise


def resumable(last: Path) -> Path | None:
    """`last` if it loads as a Lightning checkpoint; a damaged one is moved aside with a warning."""
    if not last.exists():
        return None
    try:
        checkpoint = torch.load(last, map_location="cpu", weights_only=True)
        if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("state_dict"), dict):
            raise ValueError("not a training checkpoint: it holds no state_dict")
    except Exception as err:
        reason = f"cannot be resumed from ({type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]})"
        try:
            move_aside(last, reason)
        except FileNotFoundError:  # another rank moved it first
            pass
        return None
    return last
