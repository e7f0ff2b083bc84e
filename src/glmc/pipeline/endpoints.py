"""Stage 1: train N endpoints from N seeds, or load them from the cache."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from omegaconf import OmegaConf

from glmc.config import Config
from glmc.data.module import DataModule
from glmc.eval.path import evaluate
from glmc.models.build import build_model
from glmc.pipeline.cache import EndpointCache, endpoint_key
from glmc.train.endpoint import EndpointModule

log = logging.getLogger(__name__)


@dataclass
class Endpoint:
    seed: int
    model: torch.nn.Module
    test_loss: float
    test_accuracy: float | None
    cached: bool


def cache_key(cfg: Config) -> dict[str, Any]:
    as_dict = lambda node: OmegaConf.to_container(node, resolve=True)
    return endpoint_key(as_dict(cfg.model), as_dict(cfg.data), as_dict(cfg.train))


def make_trainer(cfg: Config, run_dir: Path, logger: Any, **overrides) -> L.Trainer:
    """The Lightning Trainer shared by endpoint training and learned matching."""
    t = cfg.trainer
    kwargs = dict(
        accelerator=t.accelerator,
        devices=t.devices,
        strategy=t.strategy,
        num_nodes=t.num_nodes,
        precision=t.precision,
        deterministic=t.deterministic,
        enable_progress_bar=t.enable_progress_bar,
        log_every_n_steps=t.log_every_n_steps,
        limit_train_batches=t.limit_train_batches,
        default_root_dir=str(run_dir),
        logger=logger,
        enable_model_summary=False,
    )
    kwargs.update(overrides)
    return L.Trainer(**kwargs)


def train_endpoint(cfg: Config, seed: int, run_dir: Path, logger: Any) -> torch.nn.Module:
    L.seed_everything(seed, workers=True, verbose=False)  # seed 0 is a seed like any other
    model = build_model(cfg.model)
    module = EndpointModule(model, cfg.train, cfg.data.task)
    trainer = make_trainer(
        cfg, run_dir, logger,
        max_epochs=cfg.train.max_epochs,
        gradient_clip_val=cfg.train.gradient_clip_val,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        check_val_every_n_epoch=max(1, cfg.train.max_epochs // 5),
    )
    trainer.fit(module, datamodule=DataModule(cfg.data, seed))
    return module.model.cpu().eval()


def get_endpoints(cfg: Config, run_dir: Path, tracker, test_loader) -> list[Endpoint]:
    cache = EndpointCache(Path(cfg.cache_dir))
    key = cache_key(cfg)
    endpoints = []
    for seed in cfg.seeds:
        if cache.has(key, seed):
            model = build_model(cfg.model)
            meta = cache.load(key, seed, model)
            log.info("seed %d: loaded from %s", seed, cache.entry(key, seed))
            metrics, cached = meta["metrics"], True
        else:
            log.info("seed %d: training (cache entry %s)", seed, cache.entry(key, seed))
            model = train_endpoint(cfg, seed, run_dir, tracker.lightning_logger(f"seed_{seed}"))
            loss, acc = evaluate(model, test_loader, cfg.data.task)
            metrics, cached = {"test_loss": loss, "test_accuracy": acc}, False
            cache.save(key, seed, model, metrics)
        endpoints.append(Endpoint(seed, model.eval(), metrics["test_loss"], metrics["test_accuracy"], cached))
    return endpoints
