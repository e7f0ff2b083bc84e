"""The `trainer` config group -> Lightning Trainers (built by `instantiate`) and the evaluation device."""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from omegaconf import DictConfig, ListConfig, OmegaConf

from glmc.ranges import finite_number
from glmc.train.checkpoint_io import checkpoint_plugins
from glmc.train.denormals import FlushDenormals, flushes_here
from glmc.train.process_group import CloseProcessGroup
from glmc.train.progress_log import ProgressLog


def trainer_factory(trainer_cfg: DictConfig | Any) -> Callable[..., L.Trainer]:
    """A factory of Trainers with the group's settings (precision resolved); callers' arguments take precedence
    and their callbacks join new instances of `trainer.callbacks`, CloseProcessGroup, FlushDenormals where
    the trainer flushes subnormals (`flushes_denormals`) and, where standard output is not a terminal,
    ProgressLog in place of the bar."""
    from hydra.utils import instantiate

    precision = resolve_precision(trainer_cfg.get("precision", "32-true"), trainer_cfg.get("accelerator", "auto"))
    configured = trainer_cfg.get("callbacks") or []  # trainer.callbacks: built anew for every Trainer
    flushing = flushes_denormals(trainer_cfg)
    as_dict = isinstance(trainer_cfg, DictConfig)
    lightning_cfg = OmegaConf.to_container(trainer_cfg, resolve=True) if as_dict else dict(trainer_cfg)
    lightning_cfg.pop("flush_denormals", None)  # glmc's, not a Trainer argument
    build = instantiate(lightning_cfg, _partial_=True, precision=precision, callbacks=None)
    progress_lines = trainer_cfg.get("enable_progress_bar", True) and not _is_terminal(sys.stdout)

    def make(**overrides) -> L.Trainer:
        own = list(instantiate(configured)) if configured else []
        callbacks = [*own, *(overrides.pop("callbacks", None) or []), CloseProcessGroup()]
        if flushing:
            callbacks.append(FlushDenormals())
        if progress_lines and overrides.get("enable_progress_bar", True):
            callbacks.append(ProgressLog())
            # the lines replace the bar, whose redraws would fill a log file with control characters
            overrides["enable_progress_bar"] = False
        plugins = checkpoint_plugins(trainer_cfg, overrides)  # checkpoints written straight to their files
        if plugins is not None:
            overrides["plugins"] = plugins
        return build(**{"enable_model_summary": False, **overrides, "callbacks": callbacks})

    return make


def slices_batches_on_device(trainer_cfg: DictConfig | Any, task: str) -> bool:
    """Whether a seed's training batches are sliced from its windows on the device (a causal LM on one CUDA
    device: glmc.data.device_batches). The endpoint cache key says so: before such batches were taken as
    Lightning takes a loader's, every epoch after the first followed another order than the loader's."""
    if task != "causal_lm":
        return False
    try:
        device = resolve_device(str(trainer_cfg.get("accelerator", "auto")))
    except ValueError:  # a refused accelerator: refused where the Trainer is built
        return False
    devices = trainer_cfg.get("devices", "auto")
    if isinstance(devices, (list, tuple, ListConfig)):  # the devices' indices
        one = len(devices) == 1
    else:
        one = str(devices) == "1" or (str(devices) in ("auto", "-1") and torch.cuda.device_count() == 1)
    return device.type == "cuda" and one and int(trainer_cfg.get("num_nodes", 1)) == 1


def flushes_denormals(trainer_cfg: DictConfig | Any) -> bool:
    """Whether a Trainer of `trainer_cfg` trains with subnormals flushed to zero (glmc.train.denormals): on
    the CPU, where trainer.flush_denormals asks for it (the default) and this process can do it."""
    if not trainer_cfg.get("flush_denormals", True):
        return False
    try:
        on_cpu = resolve_device(str(trainer_cfg.get("accelerator", "auto"))).type == "cpu"
    except ValueError:  # a refused accelerator: refused where the Trainer is built
        return False
    return on_cpu and flushes_here()


def quiet_lightning() -> None:
    """Lightning's per-fit banners (device summary, tips) would drown the progress bars."""
    logging.getLogger("lightning.pytorch.utilities.rank_zero").setLevel(logging.WARNING)
    logging.getLogger("lightning.fabric.utilities.rank_zero").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
    warnings.filterwarnings("ignore", message=".*smaller than the logging interval.*")


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # replaced by an object without isatty, or closed
        return False


def resolve_device(accelerator: str) -> torch.device:
    """The device the pipeline's own tensor work (evaluation) runs on, from trainer.accelerator."""
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if accelerator in ("gpu", "cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"trainer.accelerator={accelerator} but no CUDA device is visible: use trainer=cpu")
        return torch.device("cuda", local_rank)
    if accelerator == "auto":
        return torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    if accelerator in ("mps", "cpu"):
        return torch.device(accelerator)
    raise ValueError(f"trainer.accelerator={accelerator!r} is not one of cpu, gpu, cuda, mps, auto")


# trainer.precision values: all keep float32 weights (the mixed ones autocast the forward)
TRAIN_PRECISIONS = ("auto", "32-true", "32", "bf16-mixed", "16-mixed")


def resolve_precision(precision: Any, accelerator: str) -> str:
    """trainer.precision as Lightning takes it (`auto`: bf16-mixed on a CUDA device with native bfloat16, else
    32-true); ValueError for half-precision weights and for 16-mixed on CPU (Lightning makes it bf16-mixed)."""
    precision, accelerator = str(precision), str(accelerator)
    if precision not in TRAIN_PRECISIONS:
        raise ValueError(
            f"trainer.precision={precision}: use one of {', '.join(TRAIN_PRECISIONS)}; glmc trains float32 "
            "weights (bf16-mixed and 16-mixed keep float32 master weights and autocast the forward)"
        )
    cuda = accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())
    if precision == "auto":
        return "bf16-mixed" if cuda and _native_bf16() else "32-true"
    on_cpu = accelerator == "cpu" or (accelerator == "auto" and not cuda and not torch.backends.mps.is_available())
    if precision == "16-mixed" and on_cpu:
        raise ValueError(
            "trainer.precision=16-mixed: float16 autocast needs a GPU (trainer=gpu); on CPU use "
            "trainer.precision=bf16-mixed or 32-true"
        )
    return precision


def trainer_problems(cfg: Any) -> list[str]:
    """What in trainer.* cannot train: a refused precision, or parallel endpoints spread over devices."""
    try:
        resolve_precision(cfg.trainer.precision, cfg.trainer.accelerator)
        problems = []
    except ValueError as err:
        problems = [str(err)]
    return problems + _parallel_problems(cfg)


def _parallel_problems(cfg: Any) -> list[str]:
    """train.parallel_endpoints > 1 trains each endpoint on one device: not with DDP or several."""
    trainer, parallel = cfg.trainer, cfg.train.parallel_endpoints
    if parallel in (None, 1) or not finite_number(parallel) or parallel < 1:
        return []
    if str(trainer.devices) == "1" and trainer.num_nodes == 1 and "ddp" not in str(trainer.strategy):
        return []
    return [
        f"train.parallel_endpoints={parallel}: each endpoint trains in a process of its own on one device, "
        f"not with trainer.devices={trainer.devices}, trainer.strategy={trainer.strategy}, "
        f"trainer.num_nodes={trainer.num_nodes}; use train.parallel_endpoints=1 with these, or trainer=gpu "
        "or trainer=cpu"
    ]


def trained_precision(trainer_cfg: DictConfig | Any) -> str:
    """The precision a Trainer of `trainer_cfg` trains in (auto resolved here; a refused one as is)."""
    precision = str(trainer_cfg.get("precision", "32-true"))
    try:
        return resolve_precision(precision, trainer_cfg.get("accelerator", "auto"))
    except ValueError:
        return precision


def _native_bf16() -> bool:
    """Whether the CUDA device computes in bfloat16 natively (emulated, it is slower than float32)."""
    if not torch.cuda.is_available():
        return False
    try:
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    except TypeError:  # a torch without the argument
        return bool(torch.cuda.is_bf16_supported())
