"""Non-finite training: stop at the first non-finite loss (read in groups on a GPU, so steps never wait for
it), and never cache a non-finite endpoint."""

from __future__ import annotations

import math
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback


class DivergenceError(RuntimeError):
    """Training produced a non-finite loss, weights or metrics."""


class DivergenceGuard(Callback):
    """Raises DivergenceError at the first non-finite training loss, naming `label` and `hint`."""

    # on an accelerator, the losses of this many steps are read at once (and at every epoch's end)
    DEVICE_EVERY = 50

    def __init__(self, label: str, hint: str):
        self.label, self.hint = label, hint
        self.step = 0  # training batches seen (optimisation steps without gradient accumulation)
        self._pending: list[tuple[int, int, int, torch.Tensor]] = []  # (step, epoch, batch, loss) not yet read

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}  # a resumed run counts on

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.step = int(state_dict.get("step", 0))

    def on_train_batch_end(self, trainer, pl_module, outputs: Any, batch: Any, batch_idx: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        step, self.step = self.step, self.step + 1
        if not isinstance(loss, torch.Tensor):
            return
        self._pending.append((step, trainer.current_epoch, batch_idx, loss.detach()))
        if loss.device.type == "cpu" or len(self._pending) >= self.DEVICE_EVERY:
            self.check_pending()

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.check_pending()

    def on_train_end(self, trainer, pl_module) -> None:
        self.check_pending()

    def check_pending(self) -> None:
        """DivergenceError naming the first non-finite loss among those not yet read (one read)."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        finite = torch.stack([torch.isfinite(loss).all() for *_, loss in pending])
        if bool(finite.all()):
            return
        step, epoch, batch_idx, loss = pending[int((~finite).nonzero()[0])]
        raise DivergenceError(
            f"{self.label}: training loss is {float(loss.float().sum())} at step {step} "
            f"(epoch {epoch}, batch {batch_idx}): training diverged; {self.hint}"
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
