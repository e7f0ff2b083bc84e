"""Early stopping keeps the best epoch's weights, not the last ones (Lightning keeps the last: past the best,
an overfitted GPT-2's paths dip below their endpoints). The copy is part of the callback's checkpointed state."""

from __future__ import annotations

import math
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback


class BestEpochWeights(Callback):
    """Restores the weights of the lowest `monitor` at the end of fit; `kept()` says which epoch."""

    def __init__(self, monitor: str = "val_loss"):
        self.monitor = monitor
        self.best_loss = math.inf
        self.best_epoch: int | None = None
        self.best_weights: dict[str, torch.Tensor] | None = None

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        value = trainer.callback_metrics.get(self.monitor)
        if value is None:
            return
        loss = float(value)
        if math.isfinite(loss) and loss < self.best_loss:
            self.best_loss, self.best_epoch = loss, trainer.current_epoch + 1
            self.best_weights = {k: t.detach().to("cpu", copy=True) for k, t in pl_module.state_dict().items()}

    def on_fit_end(self, trainer, pl_module) -> None:
        if self.best_weights is not None:
            pl_module.load_state_dict(self.best_weights)

    def kept(self) -> dict[str, Any] | None:
        if self.best_epoch is None:
            return None
        return {"epoch": self.best_epoch, "val_loss": self.best_loss}

    def state_dict(self) -> dict[str, Any]:
        return {"loss": self.best_loss, "epoch": self.best_epoch, "weights": self.best_weights}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.best_loss = float(state_dict.get("loss", math.inf))
        self.best_epoch = state_dict.get("epoch")
        self.best_weights = state_dict.get("weights")
