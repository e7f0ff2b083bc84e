"""Fitting a learned matcher's latents with a Lightning Trainer, with checkpoints and resume; matchers reach it
through `context.fit` (glmc.matching.base.MatchContext) and never import training code."""

from __future__ import annotations

import inspect
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from glmc.threads import adapt as adapt_threads
from glmc.train.resume import EpochCheckpoint, resumable
from glmc.train.storage import checkpoint_bytes, no_room_error

RUN_DIR = "the run folder (hydra.run.dir)"  # what chooses where a pair's checkpoints go


class _SaveLast(Callback):
    """last.ckpt at the end of training too, not only every `checkpoint_every` steps."""

    def __init__(self, path: Path):
        self.path = str(path)

    def on_train_end(self, trainer, pl_module) -> None:
        trainer.save_checkpoint(self.path, weights_only=False)  # every rank calls it; rank 0 writes


class FitClock(Callback):
    """Seconds in fit over every attempt (a checkpoint carries them), as an uninterrupted run spends."""

    def __init__(self):
        self.earlier = 0.0  # seconds in fit before the checkpoint this fit resumed from
        self._tick = time.perf_counter()

    def on_train_start(self, trainer, pl_module) -> None:
        self._tick = time.perf_counter()

    def state_dict(self) -> dict[str, Any]:
        return {"seconds": self.earlier + time.perf_counter() - self._tick}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.earlier = float(state_dict.get("seconds", 0.0))


def _fit(trainer, module, data: dict[str, Any], resume: Path | None) -> None:
    # Restore with weights_only=True, as torch.load does by default since torch 2.6 (the floor).
    restricted = {"weights_only": True} if "weights_only" in inspect.signature(trainer.fit).parameters else {}
    trainer.fit(module, **data, ckpt_path=resume, **restricted)


def fit_latents(module, context, folder: Path, settings, logger) -> tuple[float, int, Path | None, float]:
    """Train a latent module with the context's Trainer (a default one where None) on its data; returns the
    seconds in fit, the processes, the checkpoint resumed from and the seconds spent before it (0: fresh).
    One process resumes exactly from last.ckpt (the order is a function of the step); several, from the
    epoch.ckpt written at every epoch's end, the last state whose order can be restored."""
    last, epoch = folder / "checkpoints" / "last.ckpt", folder / "checkpoints" / "epoch.ckpt"
    checkpoints = ModelCheckpoint(
        dirpath=folder / "checkpoints",
        save_last=True,
        save_top_k=0,
        every_n_train_steps=settings.checkpoint_every,
        save_on_exception=True,
        enable_version_counter=False,
    )
    clock = FitClock()
    callbacks = [checkpoints, _SaveLast(last), clock]
    exact = hasattr(context.data, "train_generator_state")  # glmc.data.module.DataModule
    if exact:
        callbacks.append(EpochCheckpoint(epoch, context.data, setting=RUN_DIR))
    make_trainer = context.trainer or _default_trainer
    trainer = make_trainer(
        default_root_dir=str(folder),
        logger=logger,
        max_steps=settings.max_steps,
        max_epochs=-1,
        callbacks=callbacks,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    resume = resumable(last)
    # threads=auto: chosen from the cores free now (a shared machine), for learned matching and refinement
    adapt_threads(sum(p.numel() for p in module.parameters()), "latent training")
    stepped = exact and trainer.world_size == 1
    if stepped:
        context.data.train_start_step = 0 if resume is None else _checkpoint_step(resume)
    elif exact and resume is not None and _checkpoint_step(resume) < settings.max_steps:
        resume = resumable(epoch) or resume
    tick = time.perf_counter()
    try:
        with warnings.catch_warnings():  # the DataModule's test split is its val loader; matching has no val loop
            warnings.filterwarnings("ignore", message=".*val_dataloader.*validation_step")
            _fit(trainer, module, context.fit_data(), resume)
    except OSError as err:  # Lightning's last.ckpt (every checkpoint_every steps, and at the end) on a full disk
        refusal = no_room_error(
            err, f"the learned matching checkpoint {last.name}", last.parent, _needed(module, last), RUN_DIR
        )
        if refusal is None:
            raise
        raise refusal from err
    finally:
        if exact:  # the shared DataModule: the next fit starts from the seeded order again
            context.data.train_generator_state = None
            context.data.train_start_step = None
    return time.perf_counter() - tick, trainer.world_size, resume, clock.earlier if resume else 0.0


def _needed(module, last: Path) -> int:
    """About the bytes of `last`: the size of the one written before, else an estimate."""
    try:
        return last.stat().st_size
    except OSError:
        return checkpoint_bytes(module)


def _checkpoint_step(path: Path) -> int:
    return int(torch.load(path, map_location="cpu", weights_only=True).get("global_step", 0))


def _default_trainer(**kwargs):
    from omegaconf import OmegaConf

    from glmc.config import TrainerConfig
    from glmc.train.trainer import trainer_factory

    return trainer_factory(OmegaConf.structured(TrainerConfig(accelerator="auto")))(**kwargs)
