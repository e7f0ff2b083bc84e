"""Stage 1: train N endpoints from N seeds, or load them from the cache; with endpoints=pretrained,
load N Hugging Face model folders instead (glmc.pipeline.hf_folders), never trained nor cached; with
endpoints=finetuned, children fine-tuned from one parent on several tasks, and with endpoints=spawn,
children continued from one parent's training state (glmc.pipeline.children). `seed_vary` splits an
endpoint's seed into an initialisation seed and a data-order (and dropout) seed (`endpoint_seeds`).

Training checkpoints after every epoch into the cache's `.train_seed_<n>` folder of its config
(glmc.pipeline.cache), so the same command run again after a kill resumes there; the folder is
removed once the endpoint is cached. With train.parallel_endpoints=N > 1 the seeds not cached yet train
first, N at a time in worker processes (glmc.pipeline.side_by_side), and are then loaded from the cache;
with train.ensemble, as one batched model first (glmc.pipeline.ensemble)."""

from __future__ import annotations

import copy
import functools
import inspect
import logging
import shutil
import time
import traceback
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import EarlyStopping
from omegaconf import OmegaConf, open_dict

from glmc.config import Config
from glmc.data.fingerprint import tokenizer_checksum
from glmc.data.module import DataModule
from glmc.datasets import dataset
from glmc.eval.evaluator import Evaluator, run_evaluators
from glmc.models.build import build_model
from glmc.models.convert import to_canonical
from glmc.models.families import family_named, family_names
from glmc.pipeline.cache import CorruptEntryError, EndpointCache, endpoint_key
from glmc.pipeline.endpoint_forms import DEVIATION_LOGITS_BYTES, folder_forms, holds_forms
from glmc.pipeline.endpoint_record import Endpoint
from glmc.pipeline.ensemble import ensemble_checkpoint, train_ensemble
from glmc.pipeline.folder_fit import check_pairs, read_folders
from glmc.pipeline.hf_folders import (
    canonical_of,
    evaluation_config,
    float32_bytes,
    head_is_tied,
    load_model,
    mixed_dtypes_warning,
    untie_mixed_heads,
)
from glmc.pipeline.side_by_side import SeedFailed, train_side_by_side
from glmc.pipeline.tracking import Tracker
from glmc.threads import adapt as adapt_threads
from glmc.train.best_epoch import BestEpochWeights
from glmc.train.divergence import DivergenceGuard, check_finite_endpoint
from glmc.train.endpoint import EndpointModule, SpawnPoint
from glmc.train.resume import EpochCheckpoint, resumable
from glmc.train.snapshots import Snapshots, snapshot_dir
from glmc.train.trainer import (
    flushes_denormals,
    quiet_lightning,
    resolve_device,
    slices_batches_on_device,
    trained_precision,
    trainer_factory,
)
from glmc.train.warm_start import load_encoder

log = logging.getLogger(__name__)


def endpoint_ids(cfg: Config) -> list[int]:
    """What the run pairs: the seeds, or with endpoints=pretrained the folders' indices."""
    if str(cfg.endpoints.source) == "pretrained":
        return list(range(len(cfg.endpoints.paths)))
    return list(cfg.seeds)


def endpoint_seeds(cfg: Config, seed: int) -> tuple[int, int]:
    """(initialisation seed, data-order and dropout seed) of endpoint `seed` by `seed_vary`; a spawned child
    varies its data order only (its weights are the parent's)."""
    return {"both": (seed, seed), "init": (seed, cfg.seed_fixed), "data": (cfg.seed_fixed, seed)}[seed_vary(cfg)]


def seeds_of(cfg: Config, seed: int) -> dict[str, int]:
    """Endpoint `seed`'s two seeds as results.json records them."""
    return dict(zip(("init_seed", "data_seed"), endpoint_seeds(cfg, seed)))


def seed_vary(cfg: Config) -> str:
    return "data" if str(cfg.endpoints.source) == "spawn" else str(cfg.seed_vary)


def cache_key(cfg: Config) -> dict[str, Any]:
    as_dict = lambda node: OmegaConf.to_container(node, resolve=True)
    sources = {"corpus": dataset(cfg.data.name).fingerprint(cfg.data), "tokenizer": tokenizer_checksum(cfg.data)}
    train = as_dict(cfg.train)
    if cfg.pretrain.enabled:  # fine-tuned endpoints are keyed by the model they start from
        train["start_from"] = cache_key(pretrain_config(cfg))
    if cfg.train.early_stopping_patience is not None:  # entries cached before the rule held the last epoch's
        train["kept_weights"] = "best_epoch"
    model = as_dict(cfg.model)
    reads = family_named(model["family"]).reads_model_keys()
    for name in family_names():  # keys only other families read: this family's cache entries stay valid
        if name != model["family"]:
            for key in family_named(name).own_model_keys:
                if key not in reads:
                    model.pop(key, None)
    trainer = as_dict(cfg.trainer)
    trainer["precision"] = trained_precision(cfg.trainer)  # auto: keyed by what it trains in here
    if flushes_denormals(cfg.trainer):  # entries trained keeping subnormals keep their keys
        trainer["subnormals"] = "flushed"
    if slices_batches_on_device(cfg.trainer, str(cfg.data.task)):  # in the loader's order in every epoch
        trainer["batches"] = "sliced_in_loader_order"
    key = endpoint_key(model, as_dict(cfg.data), train, trainer, sources)
    if str(cfg.seed_vary) != "both":  # the seed the entry's does not vary (seed_vary=both: keys as before)
        key["seeds"] = {"vary": str(cfg.seed_vary), "fixed": cfg.seed_fixed}
    return key


def pretrain_config(cfg: Config) -> Config:
    """The config of the pretrained model that `pretrain.enabled` endpoints start from: the run's
    architecture with `pretrain.head`, trained on `pretrain.data` with `pretrain.train`."""
    own = copy.deepcopy(cfg)
    with open_dict(own):
        own.endpoint_models = []
        own.seeds = [cfg.pretrain.seed]
        own.model.head = cfg.pretrain.head
        own.data = copy.deepcopy(cfg.pretrain.data)
        own.train = copy.deepcopy(cfg.pretrain.train)
        own.pretrain.enabled = False
    return own


def pretrained_model(cfg: Config, run_dir: Path, tracker) -> torch.nn.Module:
    """The model that `pretrain.enabled` endpoints start from, from the cache or trained now."""
    pre = pretrain_config(cfg)
    data = DataModule(pre.data, seed=0)
    data.setup()
    evaluator = Evaluator(data.test_dataloader(), task=pre.data.task, progress=cfg.trainer.enable_progress_bar)
    cache, key, seed = EndpointCache(Path(cfg.cache_dir)), cache_key(pre), pre.pretrain.seed
    with cache.lock(key, seed) as waited:
        model, metrics, _ = load_or_train(pre, seed, key, cache, run_dir / "pretrain", tracker, evaluator, waited)
    log.info("pretrained model (seed %d): test loss %.4f on %s", seed, metrics["test_loss"], pre.data.name)
    return model


def divergence_hint(cfg: Config) -> str:
    clip = cfg.train.gradient_clip_val
    return f"lower train.lr (now {cfg.train.lr:g})" + ("" if clip else " or set train.gradient_clip_val (e.g. 1.0)")


def train_endpoint(
    cfg: Config,
    seed: int,
    run_dir: Path,
    logger: Any,
    checkpoint_dir: Path | None = None,
    start_from: torch.nn.Module | None = None,
    callbacks: tuple[Any, ...] = (),
) -> tuple[torch.nn.Module, dict[str, Any] | None]:
    """Train one endpoint; returns it and, with early stopping, which epoch's weights it holds (the
    lowest validation loss's: glmc.train.best_epoch), else None. With `checkpoint_dir`, write last.ckpt
    there after every epoch and resume from an intact one found there (a damaged one is moved aside and
    training starts afresh). With `start_from`, the model starts from that model's encoder (fine-tuning),
    or a SpawnPoint's whole training state (a spawned child, trained for the rest of the parent's budget).
    `callbacks` join the trainer's (e.g. SpawnPoints along a spawn parent's training)."""
    init_seed, data_seed = endpoint_seeds(cfg, seed)
    L.seed_everything(init_seed, workers=True, verbose=False)  # seed 0 is a seed like any other
    model = build_model(cfg.model)
    if seed_vary(cfg) != "both":  # dropout drawn from the data-order seed
        L.seed_everything(data_seed, workers=True, verbose=False)
    spawned = start_from if isinstance(start_from, SpawnPoint) else None
    if spawned is not None:
        model = spawned.model
        if spawned.step == spawned.total:  # nothing left of the budget: the parent itself
            return model.eval(), None
    elif start_from is not None:
        load_encoder(model, start_from)
    module = EndpointModule(model, cfg.train, cfg.data.task, spawned)
    data = DataModule(cfg.data, data_seed)
    data.setup()
    callbacks = [DivergenceGuard(f"seed {seed}", divergence_hint(cfg)), *callbacks]
    best = None
    resume = None
    if checkpoint_dir is not None:
        last = Path(checkpoint_dir) / "last.ckpt"
        resume = resumable(last)
        if resume is not None:
            log.info("seed %d: resuming training from %s", seed, resume)
        callbacks.append(EpochCheckpoint(last, data))
        if cfg.train.save_steps is not None:  # beside the cache entry the checkpoints belong to
            callbacks.append(Snapshots(snapshot_dir(Path(checkpoint_dir).parent, seed), cfg.train.save_steps))
    if str(cfg.endpoints.source) == "spawn":  # the data order is a function of the step: a child goes on from k
        data.train_start_step = batch_position(cfg, spawned, resume)
    if cfg.train.early_stopping_patience is not None:
        if not data.has_validation_split:
            raise ValueError(
                f"train.early_stopping_patience needs a validation split, and data={cfg.data.name} has none "
                "(its validation loop watches the test split)"
            )
        callbacks.append(EarlyStopping(monitor="val_loss", patience=cfg.train.early_stopping_patience))
        best = BestEpochWeights("val_loss")
        callbacks.append(best)
    # early stopping validates every epoch
    every = 1 if cfg.train.early_stopping_patience is not None else max(1, cfg.train.max_epochs // 5)
    trainer = trainer_factory(cfg.trainer)(
        default_root_dir=str(run_dir),
        logger=logger,
        max_epochs=cfg.train.max_epochs if spawned is None else -1,
        max_steps=-1 if spawned is None else spawned.total - spawned.step,
        gradient_clip_val=cfg.train.gradient_clip_val,
        accumulate_grad_batches=cfg.train.accumulate_grad_batches,
        callbacks=callbacks,
        enable_checkpointing=checkpoint_dir is not None,
        num_sanity_val_steps=0,
        check_val_every_n_epoch=every,
    )
    # Restore with weights_only=True where Lightning accepts it (the checkpoint holds tensors and plain data).
    restricted = {"weights_only": True} if "weights_only" in inspect.signature(trainer.fit).parameters else {}
    adapt_threads(sum(p.numel() for p in module.parameters()), "endpoint training")  # threads=auto: free cores now
    trainer.fit(module, datamodule=data, ckpt_path=resume, **restricted)
    return module.model.cpu().eval(), None if best is None else best.kept()


def batch_position(cfg: Config, spawned: SpawnPoint | None, resume: Path | None) -> int:
    """The training batch a spawn parent or child starts at in its data order (glmc.data.step_sampler): the
    parent's optimizer steps before its state (a child's), plus those of the checkpoint it resumes from."""
    done = 0 if resume is None else torch.load(resume, map_location="cpu", weights_only=True)["global_step"]
    return ((0 if spawned is None else spawned.step) + done) * cfg.train.accumulate_grad_batches


def endpoint_config(cfg: Config, index: int) -> Config:
    """The run config with endpoint `index`'s model overrides (`endpoint_models`) merged into `model`."""
    if not cfg.endpoint_models:
        return cfg
    overrides = cfg.endpoint_models[index] or {}
    own = copy.deepcopy(cfg)
    with open_dict(own):
        own.endpoint_models = []
    try:
        own.model.merge_with(overrides)
    except Exception as err:  # a misspelled key or a wrong type: name the endpoint
        raise ValueError(f"endpoint_models[{index}] (seed {cfg.seeds[index]}): {err}") from None
    return own


def get_endpoints(cfg: Config, run_dir: Path, tracker, evaluator: Evaluator) -> list[Endpoint]:
    """Every seed's endpoint, from the cache or trained now (endpoints=pretrained: every folder's
    model, loaded); each converted to canonical form once."""
    if str(cfg.endpoints.source) == "pretrained":
        return load_endpoints(cfg, evaluator)
    cache = EndpointCache(Path(cfg.cache_dir))
    shared = cfg
    endpoints = []
    # the model fine-tuned endpoints start from: loaded (or trained) once, when the first needs it
    pretrained = functools.cache(functools.partial(pretrained_model, shared, run_dir, tracker))
    # train.parallel_endpoints > 1: the seeds not cached yet train side by side first; loaded below
    fresh = train_ensemble(shared, run_dir, tracker, evaluator, seeds_to_train, endpoint_seeds, divergence_hint(shared))
    fresh |= train_side_by_side(shared, run_dir, pretrained, seeds_to_train, train_seed)
    for index, seed in enumerate(shared.seeds):
        cfg = endpoint_config(shared, index)
        key = cache_key(cfg)
        with cache.lock(key, seed) as waited:
            model, metrics, cached = load_or_train(
                cfg, seed, key, cache, run_dir, tracker, evaluator, waited, pretrained if cfg.pretrain.enabled else None
            )
        model.eval()
        cached = cached and seed not in fresh  # trained side by side by this run: not a cache hit
        endpoint = Endpoint(seed, model, to_canonical(model), metrics["test_loss"], metrics["test_accuracy"], cached)
        endpoint.kept = metrics.get("kept")
        endpoints.append(endpoint)
    return endpoints


def _seeds(seeds: list[int]) -> str:
    return f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {', '.join(map(str, seeds))}"


def training_kept(cfg: Config) -> str:
    """What endpoint training has kept so far, for the message of an interrupted run: the seeds whose
    endpoints are cached, the checkpoints of those part-trained, and the seeds with neither."""
    cache = EndpointCache(Path(cfg.cache_dir))
    cached: dict[Path, list[int]] = {}
    checkpoints, nothing = {}, []
    for index, seed in enumerate(cfg.seeds):
        key = cache_key(endpoint_config(cfg, index))
        last = cache.training_dir(key, seed) / "last.ckpt"
        if not last.exists():  # trained with other seeds as one model (train.ensemble)
            last = ensemble_checkpoint(cache.training_dir(key, seed), seed) or last
        if cache.entry(key, seed).is_dir():  # entries are renamed into place only when complete
            cached.setdefault(cache.entry(key, seed).parent, []).append(seed)
        elif last.exists():
            checkpoints[seed] = str(last)
        else:
            nothing.append((seed, cache.training_dir(key, seed).parent))
    kept = [f"{_seeds(seeds)} cached in {folder}" for folder, seeds in cached.items()]
    if checkpoints:
        epochs = "epochs" if len(checkpoints) > 1 else "epoch"
        paths = ", ".join(checkpoints.values())
        kept.append(f"the last finished {epochs} of {_seeds(list(checkpoints))} checkpointed in {paths}")
    if nothing:
        folders = sorted({str(folder) for _, folder in nothing})
        kept.append(
            f"{_seeds([seed for seed, _ in nothing])} with no finished epoch yet "
            f"(checkpoints go to {', '.join(f'{f}/.train_seed_<n>/last.ckpt' for f in folders)})"
        )
    return "; ".join(kept)


def load_or_train(
    cfg: Config,
    seed: int,
    key: dict[str, Any],
    cache: EndpointCache,
    run_dir: Path,
    tracker,
    evaluator,
    waited: bool,
    start=None,
) -> tuple[torch.nn.Module, dict[str, Any], bool]:
    """The cached endpoint, or one trained and cached now; the caller holds the entry's lock.
    `start()` gives what training starts from, called only to train: the pretrained model whose encoder
    a fine-tuned endpoint starts from, or the SpawnPoint a spawned child continues."""
    training_dir = cache.training_dir(key, seed)
    meta = None
    if cache.has(key, seed):
        model = build_model(cfg.model)
        try:
            meta = cache.load(key, seed, model)  # a damaged entry is moved aside and retrained below
            how = "finished by the run it waited for" if waited else "loaded"
            log.info("seed %d: %s from %s", seed, how, cache.entry(key, seed))
        except CorruptEntryError as err:
            log.warning("seed %d: %s; training it again", seed, err)
    if meta is not None:
        # measured again: the cached value may come from another test slice (data.limit_test) or precision
        loss, acc = evaluator.evaluate(model)
        kept = meta["metrics"].get("kept")  # with early stopping: the epoch whose weights were cached
        metrics, cached = {"test_loss": loss, "test_accuracy": acc, **({"kept": kept} if kept else {})}, True
    else:
        log.info("seed %d: training (cache entry %s)", seed, cache.entry(key, seed))
        logger = tracker.lightning_logger(f"seed_{seed}", "train")
        begin = None if start is None else start()
        model, kept = train_endpoint(cfg, seed, run_dir, logger, checkpoint_dir=training_dir, start_from=begin)
        loss, acc = evaluator.evaluate(model)
        metrics, cached = {"test_loss": loss, "test_accuracy": acc, **({"kept": kept} if kept else {})}, False
        if kept:
            log.info("seed %d: kept the weights of epoch %d (val loss %.4f)", seed, kept["epoch"], kept["val_loss"])
        check_finite_endpoint(model, metrics, f"seed {seed}", divergence_hint(cfg))  # before caching
        cache.save(key, seed, model, metrics)
    shutil.rmtree(training_dir, ignore_errors=True)  # cached: its training checkpoints are done with
    return model, metrics, cached


def seeds_to_train(cfg: Config) -> list[tuple[int, int, dict[str, Any]]]:
    """(index, seed, cache key) of every endpoint without a cache entry, in seed order."""
    cache = EndpointCache(Path(cfg.cache_dir))
    todo = []
    for index, seed in enumerate(cfg.seeds):
        key = cache_key(endpoint_config(cfg, index))
        if not cache.has(key, seed):
            todo.append((index, seed, key))
    return todo


def train_seed(cfg: Config, index: int, key: dict[str, Any], run_dir: str) -> float:
    """In a worker: train and cache endpoint `index` as the sequential loop does (get_endpoints, with the
    run's test evaluator); returns the seconds it took. Any error comes back as SeedFailed."""
    seed = cfg.seeds[index]
    start = time.perf_counter()
    try:
        _train_and_cache(cfg, index, key, Path(run_dir))
    except Exception as err:
        from glmc.pipeline.refusals import is_refusal, message_of

        raise SeedFailed(seed, message_of(err), is_refusal(err), traceback.format_exc()) from None
    return time.perf_counter() - start


def _train_and_cache(cfg: Config, index: int, key: dict[str, Any], run_dir: Path) -> None:
    quiet_lightning()
    data = DataModule(evaluation_config(cfg).data, seed=0)  # the run's evaluation data, as the run builds them
    data.setup()
    test, _ = run_evaluators(cfg, data, resolve_device(cfg.trainer.accelerator))
    cache, seed = EndpointCache(Path(cfg.cache_dir)), cfg.seeds[index]
    with Tracker(cfg, run_dir) as tracker, cache.lock(key, seed) as waited:
        start = functools.partial(pretrained_model, cfg, run_dir, tracker) if cfg.pretrain.enabled else None
        load_or_train(endpoint_config(cfg, index), seed, key, cache, run_dir, tracker, test, waited, start)


def load_endpoints(cfg: Config, evaluator) -> list[Endpoint]:
    """Every folder's model, in float32 whatever its stored dtype, converted to canonical form once and
    measured on the test split. Folders of HOLD_BELOW bytes or more hold neither form between stages
    (glmc.pipeline.endpoint_forms): each is built when a stage uses it."""
    folders = read_folders(cfg)
    if all(holds_forms(float32_bytes(f)) for f in folders):
        models = untie_mixed_heads(folders, [load_model(f) for f in folders])
        endpoints = [
            Endpoint(f.index, model, canonical_of(f, model), float("nan"), None, False, f.name, str(f.path))
            for f, model in zip(folders, models)
        ]
    else:  # one folder at a time: read once, measured, converted, its canonical form written aside, both freed
        measured: dict[int, tuple] = {}
        forms = folder_forms(folders, functools.partial(_measured_and_converted, evaluator, measured))
        endpoints = [
            Endpoint(f.index, None, None, float("nan"), None, False, f.name, str(f.path), forms=form)
            for f, form in zip(folders, forms)
        ]
        for f, e in zip(folders, endpoints):
            (e.test_loss, e.test_accuracy), logits = measured[f.index]
            e.forms.keep_logits(id(evaluator), logits)  # the run's paths use them where they run on this split
    for f, endpoint in zip(folders, endpoints):
        endpoint.dtype = f.dtype
    check_pairs(cfg, endpoints)
    mixed = mixed_dtypes_warning(cfg, folders)
    if mixed:
        log.warning(mixed)
    for f, e in zip(folders, endpoints):
        if not e.built_on_use:
            e.test_loss, e.test_accuracy = evaluator.evaluate(e.model)
        log.info("%s: %s (%s), test loss %.4f", e.name, e.path, f.hf_class, e.test_loss)
    return endpoints


def _measured_and_converted(evaluator, measured: dict[int, tuple], f) -> tuple[bool, torch.nn.Module]:
    """(whether the folder's head is tied, its canonical form); its test loss and accuracy and its first
    logits, from the same read, go into `measured`; its model is freed on return."""
    model = load_model(f)
    measured[f.index] = evaluator.evaluate(model), evaluator.logits(model, DEVIATION_LOGITS_BYTES)
    return head_is_tied(model), canonical_of(f, model, keep_source=False)
