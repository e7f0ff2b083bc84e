"""Non-finite training: stop at the first non-finite loss, and never accept a non-finite endpoint.

`DivergenceGuard` checks the training loss after every optimisation batch (one scalar read per step)
and stops with `DivergenceError`, naming the step, instead of training on for epochs on NaN
weights. `check_finite_endpoint` is the last check before an endpoint is cached.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback


class DivergenceError(RuntimeError):
    """Training produced a non-finite loss, weights or metrics."""


class DivergenceGuard(Callback):
    """Raises DivergenceError at the first training batch whose loss is NaN or infinite.

    `label` says which run it is (e.g. "seed 3"), `hint` what to change (e.g. "lower train.lr")."""

    def __init__(self, label: str, hint: str):
        self.label, self.hint = label, hint
        self.step = 0  # training batches seen (optimisation steps without gradient accumulation)

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}  # a resumed run counts on

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.step = int(state_dict.get("step", 0))

    def on_train_batch_end(self, trainer, pl_module, outputs: Any, batch: Any, batch_idx: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        step, self.step = self.step, self.step + 1
        if not isinstance(loss, torch.Tensor) or torch.isfinite(loss.detach()).all():
            return
        raise DivergenceError(
            f"{self.label}: training loss is {float(loss.detach().float().sum())} at step {step} "
            f"(epoch {trainer.current_epoch}, batch {batch_idx}): training diverged; {self.hint}"
        )


def check_finite_endpoint(model: torch.nn.Module, metrics: dict[str, Any], label: str, hint: str) -> None:
    """DivergenceError naming the first non-finite parameter or metric of a trained model."""
    for name, p in model.named_parameters():
        bad = int((~torch.isfinite(p.detach())).sum())
        if bad:
            raise DivergenceError(
                f"{label}: trained weights are not finite ({name} has {bad} NaN/inf values of {p.numel()}); "
                f"the endpoint is not cached; {hint}"
            )
    for key, value in metrics.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise DivergenceError(f"{label}: {key} is {value}; the endpoint is not cached; {hint}")
