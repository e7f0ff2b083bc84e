"""LightningModule that trains one endpoint model: a HF ViT or encoder (classification), GPT-2 (causal LM)
or an encoder with a masked-LM head; and the training state a spawned child continues from (SpawnPoint),
captured along a parent's training (SpawnPoints)."""

from __future__ import annotations

import copy
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback

from glmc.config import TrainConfig
from glmc.metrics import IGNORE_INDEX, flat_predictions, logits_of, loss_and_correct
from glmc.schedule import warmup_cosine

# Biases, norms, position embeddings and the class token are not decayed (ViT/GPT-2 practice).
NO_DECAY = ("position_embeddings", "cls_token", "wpe")


def training_loss(logits: torch.Tensor, targets: torch.Tensor, task: str, label_smoothing: float = 0.0) -> torch.Tensor:
    """The mean cross-entropy an endpoint trains on: per counted token (language tasks) or example."""
    logits, targets = flat_predictions(logits, targets, task)
    return F.cross_entropy(logits, targets, label_smoothing=label_smoothing, ignore_index=IGNORE_INDEX)


class SpawnPoint(torch.nn.Module):
    """A parent's training state after `step` of its `total` optimizer steps: its model, and AdamW's two
    moments of each parameter (in the model's parameter order) as buffers, so that the endpoint cache
    stores it as one model. The learning rate schedule's state follows from (step, total)."""

    def __init__(self, model: torch.nn.Module, step: int, total: int):
        super().__init__()
        self.model, self.step, self.total = model, step, total
        for i, p in enumerate(model.parameters()):
            self.register_buffer(f"exp_avg_{i}", torch.zeros_like(p))
            self.register_buffer(f"exp_avg_sq_{i}", torch.zeros_like(p))

    def moments(self, i: int) -> dict[str, torch.Tensor]:
        return {"exp_avg": getattr(self, f"exp_avg_{i}"), "exp_avg_sq": getattr(self, f"exp_avg_sq_{i}")}


class SpawnPoints(Callback):
    """Hands the training state after each optimizer step of `steps` (0: before the first) to
    `save(step, SpawnPoint)`, a copy on the CPU."""

    def __init__(self, steps: list[int], save):
        self.pending, self.save = set(steps), save

    def on_train_start(self, trainer, pl_module) -> None:
        self._capture(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        self._capture(trainer, pl_module)

    def _capture(self, trainer, pl_module) -> None:
        step = trainer.global_step
        if step not in self.pending:
            return
        self.pending.discard(step)
        live = list(pl_module.model.parameters())
        point = SpawnPoint(copy.deepcopy(pl_module.model).cpu(), step, int(trainer.estimated_stepping_batches))
        state = trainer.optimizers[0].state
        with torch.no_grad():
            for i, p in enumerate(live):
                for name, buffer in point.moments(i).items():
                    if p in state:
                        buffer.copy_(state[p][name])
        self.save(step, point)


def continue_from(point: SpawnPoint, optimizer: torch.optim.Optimizer, scheduler) -> None:
    """Set a fresh AdamW and its warmup_cosine schedule (built over `point.total` steps) to where the
    parent's stood after `point.step` steps."""
    if point.step:
        index = {p: i for i, p in enumerate(point.model.parameters())}
        saved = optimizer.state_dict()
        ordered = [p for group in optimizer.param_groups for p in group["params"]]  # state_dict's numbering
        step = torch.tensor(float(point.step))
        saved["state"] = {n: {"step": step.clone(), **point.moments(index[p])} for n, p in enumerate(ordered)}
        optimizer.load_state_dict(saved)
    continue_schedule(point.step, optimizer, scheduler)


def continue_schedule(step: int, optimizer: torch.optim.Optimizer, scheduler) -> None:
    """Set a fresh warmup_cosine schedule and its optimizer's learning rates to where they stood after `step`."""
    lrs = [base * factor(step) for base, factor in zip(scheduler.base_lrs, scheduler.lr_lambdas)]
    for group, lr in zip(optimizer.param_groups, lrs):
        group["lr"] = lr
    scheduler.last_epoch, scheduler._last_lr = step, lrs


def adamw_with_schedule(cfg: TrainConfig, named: list, fused: bool, total: int):
    """AdamW over `named` ((name, parameter, its own number of dimensions)), weight decay on the matrices
    outside NO_DECAY, and the warmup_cosine schedule over `total` steps."""
    decay, no_decay = [], []
    for name, p, ndim in named:
        (no_decay if ndim < 2 or any(k in name for k in NO_DECAY) else decay).append(p)
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        **({"fused": True} if fused else {}),
    )
    return optimizer, warmup_cosine(optimizer, total, cfg.warmup_fraction)


class EndpointModule(L.LightningModule):
    """`start`: a spawned child's training state, continued from (`model` is `start.model`)."""

    def __init__(self, model: torch.nn.Module, train_cfg: TrainConfig, task: str, start: SpawnPoint | None = None):
        super().__init__()
        self.model = model
        self.train_cfg = train_cfg
        self.task = task
        object.__setattr__(self, "start", start)  # not a submodule: the model is its own, and is saved as such
        self.fused_adamw: bool | None = None  # None: where it suits the parameters (fused_adamw_suits)

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
        named = [(name, p, p.ndim) for name, p in self.model.named_parameters()]
        total = self.trainer.estimated_stepping_batches if self.start is None else self.start.total
        optimizer, scheduler = adamw_with_schedule(self.train_cfg, named, self._fused_adamw(), total)
        if self.start is not None:
            continue_from(self.start, optimizer, scheduler)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def _fused_adamw(self) -> bool:
        if self.fused_adamw is not None:
            return self.fused_adamw
        return fused_adamw_suits(self.model.parameters(), self)


def fused_adamw_suits(params, module: L.LightningModule) -> bool:
    """A fused AdamW (one kernel per tensor, on CUDA or the CPU) where every parameter is on one of those,
    unless `module`'s Trainer would refuse to clip its gradients. On the CPU it took 0.4x the for-loop
    AdamW's time on the digits ViT's tensors; its updates differ from the loop's by round-off (1e-7)."""
    kinds = {p.device.type for p in params}
    if len(kinds) != 1 or not kinds <= {"cuda", "cpu"}:
        return False
    try:
        trainer = module.trainer
    except RuntimeError:  # configured outside a fit: nothing clips
        return True
    return not fused_clipping_refused(trainer.precision_plugin, trainer.gradient_clip_val)


def fused_clipping_refused(precision_plugin: Any, clip_val: float | None) -> bool:
    """Whether Lightning's autocast plugin refuses gradient clipping for a fused optimizer."""
    from lightning.pytorch.plugins.precision import MixedPrecision

    return bool(clip_val) and isinstance(precision_plugin, MixedPrecision)
