"""Training progress as INFO log lines for output that is not a terminal (rank 0 only), after the first step,
every `every_seconds` (or `every_steps`) and after the last:

    training seed 0: step 120/480 (epoch 2), loss 1.2345, 8.4 steps/s, 43s left
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback

log = logging.getLogger(__name__)


def duration(seconds: float) -> str:
    """12s, 3m05s, 2h07m."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def run_label(trainer, pl_module) -> str:
    """What is training: the module's `progress_name`, its DivergenceGuard's label, or its class."""
    from glmc.train.divergence import DivergenceGuard

    name = getattr(pl_module, "progress_name", None)
    if name:
        return str(name)
    for callback in trainer.callbacks:
        if isinstance(callback, DivergenceGuard):
            return f"training {callback.label}"
    return type(pl_module).__name__


class ProgressLog(Callback):
    """An INFO line per interval: step, loss, steps per second and time left (see the module)."""

    def __init__(self, every_seconds: float = 30.0, every_steps: int | None = None, label: str | None = None):
        if every_seconds < 0 or (every_steps is not None and every_steps < 1):
            raise ValueError(f"every_seconds={every_seconds} must be >= 0 and every_steps={every_steps} >= 1")
        self.every_seconds, self.every_steps, self.label = every_seconds, every_steps, label
        self._last_time = self._start_time = 0.0
        self._last_step = self._start_step = 0
        self._name = ""

    def on_train_start(self, trainer, pl_module) -> None:
        self._name = self.label or run_label(trainer, pl_module)
        self._last_time = self._start_time = time.monotonic()
        self._last_step = self._start_step = trainer.global_step  # a resumed run counts on from there

    @staticmethod
    def total_steps(trainer) -> float:
        if trainer.max_steps is not None and trainer.max_steps > 0:
            return trainer.max_steps
        try:
            return float(trainer.estimated_stepping_batches)
        except Exception:  # an iterable loader without a length
            return math.inf

    def on_train_batch_end(self, trainer, pl_module, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        if not trainer.is_global_zero or step == self._last_step:
            return  # another rank, or a micro-batch of gradient accumulation
        now, total = time.monotonic(), self.total_steps(trainer)
        due = (
            step == self._start_step + 1
            or step >= total
            or now - self._last_time >= self.every_seconds
            or (self.every_steps is not None and step % self.every_steps == 0)
        )
        if due:
            self.write(trainer, outputs, step, total, now)

    def write(self, trainer, outputs: Any, step: int, total: float, now: float) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        rate = (step - self._last_step) / max(now - self._last_time, 1e-9)
        parts = [f"step {step}/{total:.0f}" if math.isfinite(total) else f"step {step}"]
        parts[0] += f" (epoch {trainer.current_epoch})"
        if isinstance(loss, torch.Tensor):
            parts.append(f"loss {float(loss.detach().float().mean()):.4f}")
        parts.append(f"{rate:.3g} steps/s")
        if math.isfinite(total):
            parts.append(f"{duration((total - step) / rate)} left" if step < total else "done")
        log.info("%s: %s", self._name, ", ".join(parts))
        self._last_time, self._last_step = now, step

    def on_train_end(self, trainer, pl_module) -> None:
        steps = trainer.global_step - self._start_step
        if trainer.is_global_zero and steps > 0:
            seconds = time.monotonic() - self._start_time
            log.info(
                "%s: %d steps in %s (%.3g steps/s)", self._name, steps, duration(seconds), steps / max(seconds, 1e-9)
            )
