"""train.ensemble: the seeds not cached yet train together as one batched model (glmc.train.ensemble)
before the sequential loop, each member then cached exactly as a separately trained seed is (same key,
same metrics), so that the loop loads it and later runs cannot tell how it was trained. The ensemble
writes last.ckpt after every epoch into .train_ensemble_<seeds> beside the members' entries; a rerun with
the same seeds resumes from it, and it is removed once the members are cached. Where members cannot be
stacked, one line says why and the seeds train one at a time.

With train.early_stopping_patience each member stops and keeps its best epoch's weights on its own, as a
seed alone does (glmc.train.ensemble.MemberStopping), and its entry records that epoch as a seed alone's
does. endpoints=spawn: the children of one spawn point not cached yet train together from the parent's
state (`start`), each with its own data order, as each would alone."""

from __future__ import annotations

import contextlib
import copy
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
from glmc.host_memory import large_blocks_from_heap
from glmc.models.build import build_model
from glmc.pipeline.cache import EndpointCache
from glmc.train.divergence import DivergenceGuard, check_finite_endpoint
from glmc.train.endpoint import SpawnPoint
from glmc.train.ensemble import EnsembleCheckpoint, EnsembleModule
from glmc.train.resume import resumable
from glmc.train.trainer import resolve_device, trainer_factory

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


def why_not_stacked(cfg: Config, spawned: bool = False) -> str | None:
    """Why the endpoints of `cfg` cannot train as one batched model, or None where they can; `spawned`:
    they are children of one spawn point (endpoints=spawn), continued from the parent's state."""
    source = str(cfg.endpoints.source)
    reasons = [
        (source != ("spawn" if spawned else "trained"), f"endpoints={source} does not train from scratch"),
        (bool(cfg.pretrain.enabled), "pretrain.enabled: each endpoint starts from a pretrained encoder"),
        (bool(cfg.endpoint_models), "endpoint_models gives the seeds different models"),
        (cfg.train.save_steps is not None, "train.save_steps snapshots one seed's training"),
        (cfg.trainer.devices not in (1, "1") or cfg.trainer.num_nodes != 1, "it trains on one device only"),
        (int(os.environ.get("WORLD_SIZE", "1")) > 1, "it trains in one process only"),
    ]
    return next((reason for refused, reason in reasons if refused), None)


def train_ensemble(
    cfg: Config, run_dir: Path, tracker, evaluator, seeds_to_train, seeds_of, hint: str, start=None
) -> set[int]:
    """Train the endpoints `seeds_to_train(cfg)` gives ((index, seed, key) of those not cached) as one
    model and cache each; returns the seeds it trained. `seeds_of(cfg, seed)`: a seed's (initialisation,
    data-order) seeds; `hint`: what to change where training diverges; `start()`: the SpawnPoint spawned
    children continue (called only to train), None to train from scratch."""
    if not cfg.train.ensemble:
        return set()
    todo = seeds_to_train(cfg)
    if len(todo) < 2:
        return set()
    reason = why_not_stacked(cfg, spawned=start is not None)
    if reason is not None:
        log.info("train.ensemble: training one seed at a time, since %s", reason)
        return set()
    cache = EndpointCache(Path(cfg.cache_dir))
    with contextlib.ExitStack() as locks:
        for _, seed, key in todo:
            locks.enter_context(cache.lock(key, seed))
        todo = [(i, seed, key) for i, seed, key in todo if not cache.has(key, seed)]  # another run's, meanwhile
        point = None if start is None or len(todo) < 2 else start()
        if len(todo) < 2 or (point is not None and point.step == point.total):  # at the budget: the parent
            return set()
        seeds = [seed for _, seed, _ in todo]
        log.info("seeds %s: training together as one batched model (train.ensemble)", seeds)
        # checkpointed after every epoch beside the members' entries; a rerun with these seeds resumes
        folder = cache.training_dir(todo[0][2], seeds[0]).parent / ensemble_folder_name(seeds)
        module = _fit(cfg, run_dir, tracker, [seeds_of(cfg, seed) for seed in seeds], hint, folder, point)
        for k, (_, seed, key) in enumerate(todo):
            _cache_member(cfg, cache, key, seed, module, k, evaluator, hint)
        shutil.rmtree(folder, ignore_errors=True)  # every member cached: its checkpoints are done with
    return set(seeds)


def _cache_member(cfg: Config, cache: EndpointCache, key, seed: int, module: EnsembleModule, k: int, evaluator, hint):
    """Member k cached as seed `seed` alone is (glmc.pipeline.endpoints.load_or_train): its kept weights,
    measured, with the epoch they are from where early stopping kept its best."""
    state, kept = module.kept_state(k)
    model = build_model(cfg.model)
    _load_member(model, state)
    model.eval()
    loss, acc = evaluator.evaluate(model)
    metrics = {"test_loss": loss, "test_accuracy": acc, **({"kept": kept} if kept else {})}
    if kept:
        log.info("seed %d: kept the weights of epoch %d (val loss %.4f)", seed, kept["epoch"], kept["val_loss"])
    check_finite_endpoint(model, metrics, f"seed {seed}", hint)
    cache.save(key, seed, model, metrics)


def _fit(
    cfg: Config,
    run_dir: Path,
    tracker,
    member_seeds: list[tuple[int, int]],
    hint: str,
    folder: Path | None = None,
    start: SpawnPoint | None = None,
) -> EnsembleModule:
    """The members trained as one model; with `folder`, last.ckpt there after every epoch, resumed from;
    with `start`, each continues that training state (a spawned child) for the rest of its budget."""
    module = _members(cfg, member_seeds, start)
    L.seed_everything(member_seeds[0][1], workers=True, verbose=False)  # the dropout masks' shared stream
    callbacks: list[Any] = [DivergenceGuard("the ensemble", hint)]
    resume = None
    if folder is not None:
        resume = resumable(folder / "last.ckpt")
        if resume is not None:
            log.info("train.ensemble: resuming training from %s", resume)
        streams = module.fetch_streams
        callbacks.append(EnsembleCheckpoint(folder / "last.ckpt", module.train_loaders, streams, module.stopping))
    patience = cfg.train.early_stopping_patience
    trainer = trainer_factory(cfg.trainer)(
        default_root_dir=str(run_dir),
        logger=tracker.lightning_logger("ensemble", "train"),
        max_epochs=cfg.train.max_epochs if start is None else -1,
        max_steps=-1 if start is None else start.total - start.step,
        gradient_clip_val=cfg.train.gradient_clip_val,
        accumulate_grad_batches=cfg.train.accumulate_grad_batches,
        callbacks=callbacks,
        enable_checkpointing=folder is not None,
        num_sanity_val_steps=0,
        # validation when a seed alone validates (early stopping: every epoch), so its draws are mirrored
        check_val_every_n_epoch=1 if patience is not None else max(1, cfg.train.max_epochs // 5),
    )
    # weights_only=True where Lightning accepts it (the checkpoint holds tensors and plain data)
    restricted = {"weights_only": True} if "weights_only" in inspect.signature(trainer.fit).parameters else {}
    on_cpu = resolve_device(str(cfg.trainer.accelerator)).type == "cpu"
    with large_blocks_from_heap() if on_cpu else contextlib.nullcontext():  # K members' activations at once
        trainer.fit(module, ckpt_path=resume, **restricted)
    return module.cpu()


def _members(cfg: Config, member_seeds: list[tuple[int, int]], start: SpawnPoint | None) -> EnsembleModule:
    """The ensemble of the members, each built (or, with `start`, copied from its model) as train_endpoint
    builds it alone, with its own fetch stream and training loader over one copy of the splits."""
    models, streams = [], []
    for init_seed, data_seed in member_seeds:
        L.seed_everything(init_seed, workers=True, verbose=False)
        models.append(build_model(cfg.model) if start is None else copy.deepcopy(start.model))
        if start is not None or str(cfg.seed_vary) != "both":  # what follows draws from the data-order seed
            L.seed_everything(data_seed, workers=True, verbose=False)
        streams.append(torch.get_rng_state())  # what its fetches draw from (masked-LM masks), as alone
    with torch.device("meta"):  # the structure the stacked weights are called through (ties included)
        base = build_model(cfg.model)
    module = EnsembleModule(models, base, cfg.train, cfg.data.task, start)
    module.fetch_streams[:] = streams
    first, device = None, resolve_device(str(cfg.trainer.accelerator))
    for _, data_seed in member_seeds:  # each member's own shuffling, over one copy of the splits
        data = DataModule(cfg.data, data_seed)
        if first is None:
            data.setup()
            first = data
        data.train_set, data.val_set, data.test_set = first.train_set, first.val_set, first.test_set
        if start is not None:  # the data order is a function of the step: a child goes on from the parent's
            data.train_start_step = start.step * cfg.train.accumulate_grad_batches
        # batched where a seed alone's are (text windows sliced on a GPU), from one copy of the windows there
        data.training_device = device
        data.device_windows = getattr(module.train_loaders[0], "windows", None) if module.train_loaders else None
        module.train_loaders.append(data.train_dataloader())
    if cfg.train.early_stopping_patience is not None and not first.has_validation_split:
        raise ValueError(
            f"train.early_stopping_patience needs a validation split, and data={cfg.data.name} has none "
            "(its validation loop watches the test split)"
        )
    module.val_loader = first.val_dataloader()
    return module


def _load_member(model: torch.nn.Module, state: dict[str, Any]) -> None:
    """Member weights into a model of the same architecture (tied weights follow their first name)."""
    targets = dict(model.named_parameters()) | dict(model.named_buffers())
    with torch.no_grad():
        for name, tensor in state.items():
            targets[name].copy_(tensor)
