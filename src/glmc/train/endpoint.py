"""LightningModule that trains one endpoint model: a HF ViT or encoder (classification), GPT-2 (causal LM)
or an encoder with a masked-LM head."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
import torch.nn.functional as F

from glmc.config import TrainConfig
from glmc.metrics import IGNORE_INDEX, flat_predictions, logits_of, loss_and_correct
from glmc.schedule import warmup_cosine

# Biases, norms, position embeddings and the class token are not decayed (ViT/GPT-2 practice).
NO_DECAY = ("position_embeddings", "cls_token", "wpe")


def training_loss(logits: torch.Tensor, targets: torch.Tensor, task: str, label_smoothing: float = 0.0) -> torch.Tensor:
    """The mean cross-entropy an endpoint trains on: per counted token (language tasks) or example."""
    logits, targets = flat_predictions(logits, targets, task)
    return F.cross_entropy(logits, targets, label_smoothing=label_smoothing, ignore_index=IGNORE_INDEX)


class EndpointModule(L.LightningModule):
    def __init__(self, model: torch.nn.Module, train_cfg: TrainConfig, task: str):
        super().__init__()
        self.model = model
        self.train_cfg = train_cfg
        self.task = task
        self.fused_adamw: bool | None = None  # None: where every parameter is on CUDA (_fused_adamw)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return logits_of(self.model, inputs)

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        loss = training_loss(self(inputs), targets, self.task, self.train_cfg.label_smoothing)
        # a tensor: the logger reads it on the host only every log_every_n_steps, so the step never waits
        self.log("train_loss", loss, prog_bar=True, on_step=True, on_epoch=False, sync_dist=False)
        return loss

    def validation_step(self, batch, batch_idx):
        inputs, targets = batch
        loss, correct, count = loss_and_correct(self(inputs), targets, self.task)
        count = int(count)  # Lightning weights the epoch mean by it
        self.log("val_loss", loss / count, prog_bar=True, batch_size=count)
        self.log("val_acc", correct.float() / count, prog_bar=True, batch_size=count)

    def configure_optimizers(self):
        cfg = self.train_cfg
        decay, no_decay = [], []
        for name, p in self.model.named_parameters():
            exempt = p.ndim < 2 or any(k in name for k in NO_DECAY)
            (no_decay if exempt else decay).append(p)
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=cfg.lr,
            **({"fused": True} if self._fused_adamw() else {}),
        )
        scheduler = warmup_cosine(optimizer, self.trainer.estimated_stepping_batches, cfg.warmup_fraction)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def _fused_adamw(self) -> bool:
        """A fused AdamW where every parameter is on CUDA, unless Lightning would refuse to clip its gradients."""
        if self.fused_adamw is not None:
            return self.fused_adamw
        on_cuda = all(p.is_cuda for p in self.model.parameters())
        return on_cuda and not fused_clipping_refused(self.trainer.precision_plugin, self.trainer.gradient_clip_val)


def fused_clipping_refused(precision_plugin: Any, clip_val: float | None) -> bool:
    """Whether Lightning's autocast plugin refuses gradient clipping for a fused optimizer."""
    from lightning.pytorch.plugins.precision import MixedPrecision

    return bool(clip_val) and isinstance(precision_plugin, MixedPrecision)
