"""The `trainer` config group -> Lightning Trainers (built by `instantiate`) and the evaluation device."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from omegaconf import DictConfig

from glmc.train.process_group import CloseProcessGroup
from glmc.train.progress_log import ProgressLog


def trainer_factory(trainer_cfg: DictConfig | Any) -> Callable[..., L.Trainer]:
    """A factory of Trainers with the group's settings; callers add their own arguments
    (default_root_dir, logger, callbacks, max_steps, ...), which take precedence; every Trainer also
    closes the process group of spawned DDP ranks at the end of fit (glmc.train.process_group) and,
    with progress enabled and standard output not a terminal, logs its progress as lines
    (glmc.train.progress_log) instead of drawing a bar."""
    from hydra.utils import instantiate

    build = instantiate(trainer_cfg, _partial_=True)
    progress_lines = trainer_cfg.get("enable_progress_bar", True) and not _is_terminal(sys.stdout)

    def make(**overrides) -> L.Trainer:
        callbacks = [*(overrides.pop("callbacks", None) or []), CloseProcessGroup()]
        if progress_lines and overrides.get("enable_progress_bar", True):
            callbacks.append(ProgressLog())
            # the lines replace the bar, whose redraws would fill a log file with control characters
            overrides["enable_progress_bar"] = False
        return build(**{"enable_model_summary": False, **overrides, "callbacks": callbacks})

    return make


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
    if accelerator == "mps":
        return torch.device("mps")
    if accelerator == "cpu":
        return torch.device("cpu")
    raise ValueError(f"trainer.accelerator={accelerator!r} is not one of cpu, gpu, cuda, mps, auto")
