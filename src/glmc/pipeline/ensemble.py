"""train.ensemble: the seeds not cached yet train together as one batched model (glmc.train.ensemble)
before the sequential loop, each member then cached exactly as a separately trained seed is (same key,
same metrics), so that the loop loads it and later runs cannot tell how it was trained. The ensemble
writes last.ckpt after every epoch into .train_ensemble_<seeds> beside the members' entries; a rerun with
the same seeds resumes from it, and it is removed once the members are cached. Where members cannot be
stacked, one line says why and the seeds train one at a time."""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import lightning as L
import torch

from glmc.config import Config
from glmc.data.module import DataModule
from glmc.models.build import build_model
from glmc.pipeline.cache import EndpointCache
from glmc.train.divergence import DivergenceGuard, check_finite_endpoint
from glmc.train.ensemble import EnsembleCheckpoint, EnsembleModule
from glmc.train.resume import resumable
from glmc.train.trainer import trainer_factory

log = logging.getLogger(__name__)


def ensemble_folder_name(seeds: list[int]) -> str:
    """The folder an ensemble of `seeds` checkpoints into, beside the members' cache entries."""
    return ".train_ensemble_" + "_".join(map(str, seeds))


def ensemble_checkpoint(training_dir: Path, seed: int) -> Path | None:
    """The last.ckpt of an interrupted ensemble that trains `seed` (beside its `training_dir`), if any."""
    for folder in sorted(training_dir.parent.glob(".train_ensemble_*")):
        members = folder.name.removeprefix(".train_ensemble_").split("_")
        if str(seed) in members and (folder / "last.ckpt").exists():
            return folder / "last.ckpt"
    return None


def why_not_stacked(cfg: Config) -> str | None:
    """Why the endpoints of `cfg` cannot train as one batched model, or None where they can."""
    reasons = [
        (str(cfg.endpoints.source) != "trained", f"endpoints={cfg.endpoints.source} does not train from scratch"),
        (bool(cfg.pretrain.enabled), "pretrain.enabled: each endpoint starts from a pretrained encoder"),
        (bool(cfg.endpoint_models), "endpoint_models gives the seeds different models"),
        (cfg.train.early_stopping_patience is not None, "train.early_stopping_patience stops each seed on its own"),
        (cfg.train.save_steps is not None, "train.save_steps snapshots one seed's training"),
        (cfg.trainer.devices not in (1, "1") or cfg.trainer.num_nodes != 1, "it trains on one device only"),
        (int(os.environ.get("WORLD_SIZE", "1")) > 1, "it trains in one process only"),
    ]
    return next((reason for refused, reason in reasons if refused), None)


def train_ensemble(cfg: Config, run_dir: Path, tracker, evaluator, seeds_to_train, seeds_of, hint: str) -> set[int]:
    """Train the endpoints `seeds_to_train(cfg)` gives ((index, seed, key) of those not cached) as one
    model and cache each;
    returns the seeds it trained. `seeds_of(cfg, seed)`: a seed's (initialisation, data-order) seeds;
    `hint`: what to change where training diverges."""
    if not cfg.train.ensemble:
        return set()
    todo = seeds_to_train(cfg)
    if len(todo) < 2:
        return set()
    reason = why_not_stacked(cfg)
    if reason is not None:
        log.info("train.ensemble: training one seed at a time, since %s", reason)
        return set()
    cache = EndpointCache(Path(cfg.cache_dir))
    with contextlib.ExitStack() as locks:
        for _, seed, key in todo:
            locks.enter_context(cache.lock(key, seed))
        todo = [(i, seed, key) for i, seed, key in todo if not cache.has(key, seed)]  # another run's, meanwhile
        if len(todo) < 2:
            return set()
        seeds = [seed for _, seed, _ in todo]
        log.info("seeds %s: training together as one batched model (train.ensemble)", seeds)
        # checkpointed after every epoch beside the members' entries; a rerun with these seeds resumes
        folder = cache.training_dir(todo[0][2], seeds[0]).parent / ensemble_folder_name(seeds)
        module = _fit(cfg, run_dir, tracker, [seeds_of(cfg, seed) for seed in seeds], hint, folder)
        for k, (_, seed, key) in enumerate(todo):
            model = build_model(cfg.model)
            _load_member(model, module.member_state(k))
            model.eval()
            loss, acc = evaluator.evaluate(model)
            metrics = {"test_loss": loss, "test_accuracy": acc}
            check_finite_endpoint(model, metrics, f"seed {seed}", hint)
            cache.save(key, seed, model, metrics)
        shutil.rmtree(folder, ignore_errors=True)  # every member cached: its checkpoints are done with
    return set(seeds)


def _fit(
    cfg: Config, run_dir: Path, tracker, member_seeds: list[tuple[int, int]], hint: str, folder: Path | None = None
) -> EnsembleModule:
    """The members trained as one model; with `folder`, last.ckpt there after every epoch, resumed from."""
    models, streams = [], []
    for init_seed, data_seed in member_seeds:  # each built as train_endpoint builds it alone
        L.seed_everything(init_seed, workers=True, verbose=False)
        models.append(build_model(cfg.model))
        if str(cfg.seed_vary) != "both":  # as train_endpoint: what follows draws from the data-order seed
            L.seed_everything(data_seed, workers=True, verbose=False)
        streams.append(torch.get_rng_state())  # what its fetches draw from (masked-LM masks), as alone
    with torch.device("meta"):  # the structure the stacked weights are called through (ties included)
        base = build_model(cfg.model)
    module = EnsembleModule(models, base, cfg.train, cfg.data.task)
    module.fetch_streams[:] = streams
    module.validate_every = max(1, cfg.train.max_epochs // 5)  # as train_endpoint (no early stopping here)
    first = None
    for _, data_seed in member_seeds:  # each member's own shuffling, over one copy of the splits
        data = DataModule(cfg.data, data_seed)
        if first is None:
            data.setup()
            first = data
        data.train_set, data.val_set, data.test_set = first.train_set, first.val_set, first.test_set
        module.train_loaders.append(data.train_dataloader())
    L.seed_everything(member_seeds[0][1], workers=True, verbose=False)  # the dropout masks' shared stream
    callbacks: list[Any] = [DivergenceGuard("the ensemble", hint)]
    resume = None
    if folder is not None:
        resume = resumable(folder / "last.ckpt")
        if resume is not None:
            log.info("train.ensemble: resuming training from %s", resume)
        callbacks.append(EnsembleCheckpoint(folder / "last.ckpt", module.train_loaders, module.fetch_streams))
    trainer = trainer_factory(cfg.trainer)(
        default_root_dir=str(run_dir),
        logger=tracker.lightning_logger("ensemble", "train"),
        max_epochs=cfg.train.max_epochs,
        gradient_clip_val=cfg.train.gradient_clip_val,
        accumulate_grad_batches=cfg.train.accumulate_grad_batches,
        callbacks=callbacks,
        enable_checkpointing=folder is not None,
        limit_val_batches=0,
        num_sanity_val_steps=0,
    )
    # weights_only=True where Lightning accepts it (the checkpoint holds tensors and plain data)
    restricted = {"weights_only": True} if "weights_only" in inspect.signature(trainer.fit).parameters else {}
    trainer.fit(module, ckpt_path=resume, **restricted)
    return module.cpu()


def _load_member(model: torch.nn.Module, state: dict[str, Any]) -> None:
    """Member weights into a model of the same architecture (tied weights follow their first name)."""
    targets = dict(model.named_parameters()) | dict(model.named_buffers())
    with torch.no_grad():
        for name, tensor in state.items():
            targets[name].copy_(tensor)
