"""Several endpoints of one architecture trained as one batched model (train.ensemble): their parameters
stacked along a new leading axis (member k at index k), one vmapped forward and backward for all. Each
member keeps its own initial weights, data order (its own loader, zipped with the others), the random
stream its fetches draw from (masked-LM masks: torch's global one for a seed alone), AdamW state
(AdamW is elementwise, so one AdamW over the stacked tensors is K independent ones), warmup_cosine
schedule and gradient-norm clipping (per member, as torch.nn.utils.clip_grad_norm_ computes it).

Dropout draws each member's own masks (vmap randomness="different"), from one shared generator: not
the masks a separate run draws, so only with dropout 0 does a member equal its separate run (within
the round-off of sums taken in another order)."""

from __future__ import annotations

import functools
from typing import Any

import lightning as L
import torch
from torch.func import functional_call, stack_module_state

from glmc.config import TrainConfig
from glmc.metrics import logits_of
from glmc.schedule import warmup_cosine
from glmc.train.endpoint import NO_DECAY, fused_clipping_refused, training_loss
from glmc.train.resume import EpochCheckpoint


class ZippedBatches:
    """The members' own training loaders in step: each batch is theirs stacked along a new first axis.
    `streams`: each member's CPU random state, what its fetches draw from in place of torch's global one
    (masked-LM training masks are drawn at every fetch); updated in place, so that it can be checkpointed."""

    def __init__(self, loaders: list[Any], streams: list[torch.Tensor], validated=lambda: False):
        self.loaders, self.streams, self.validated = loaders, streams, validated

    def __len__(self) -> int:
        return min(len(loader) for loader in self.loaders)

    def __iter__(self):
        # a seed alone iterates its validation loader here, whose shared seed comes from the global generator
        if self.validated():
            for k in range(len(self.streams)):
                self._drawn(k, lambda: torch.empty((), dtype=torch.int64).random_())
        iterators = [iter(loader) for loader in self.loaders]
        while True:
            batches = []
            for k, iterator in enumerate(iterators):
                batch = self._drawn(k, functools.partial(next, iterator, None))
                if batch is None:
                    return
                batches.append(batch)
            yield tuple(torch.stack(parts) for parts in zip(*batches))

    def _drawn(self, k: int, draw) -> Any:
        """`draw()` drawing from member k's stream."""
        if not self.streams:
            return draw()
        outside = torch.get_rng_state()
        torch.set_rng_state(self.streams[k])
        try:
            return draw()
        finally:
            self.streams[k] = torch.get_rng_state()
            torch.set_rng_state(outside)


class EnsembleModule(L.LightningModule):
    """`models`: the members, each built as it would be alone; `base`: one more of the same architecture
    (on the meta device, so that it holds no memory) whose structure, tied weights included, the stacked
    parameters are called through."""

    def __init__(self, models: list[torch.nn.Module], base: torch.nn.Module, train_cfg: TrainConfig, task: str):
        super().__init__()
        params, buffers = stack_module_state(models)
        self.names = list(params)
        self.stacked = torch.nn.ParameterList(torch.nn.Parameter(params[name]) for name in self.names)
        self.buffer_names = list(buffers)
        for i, name in enumerate(self.buffer_names):
            self.register_buffer(f"buffer_{i}", buffers[name])
        object.__setattr__(self, "base", base)  # not a submodule: it holds no weights of its own
        self.members, self.train_cfg, self.task = len(models), train_cfg, task
        self.train_loaders: list[Any] = []
        self.fetch_streams: list[torch.Tensor] = []  # see ZippedBatches
        self.validate_every = 0  # after which epochs a seed alone validates (0: never)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """Every member's logits of its own inputs: (K, ...) in, (K, ...) out."""
        buffers = {name: getattr(self, f"buffer_{i}") for i, name in enumerate(self.buffer_names)}
        params = dict(zip(self.names, self.stacked))

        def one(p, b, x):
            return logits_of(_Called(self.base, p, b), x)

        return torch.vmap(one, randomness="different")(params, buffers, inputs)

    def train_dataloader(self) -> ZippedBatches:
        return ZippedBatches(self.train_loaders, self.fetch_streams, self._validated_before)

    def _validated_before(self) -> bool:
        """Whether a seed alone validates between the last epoch and this one."""
        epoch = self.trainer.current_epoch
        return bool(self.validate_every) and epoch > 0 and epoch % self.validate_every == 0

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        logits = self(inputs)
        # the sum of the members' mean losses: each member's gradient is its own loss's
        smoothing = self.train_cfg.label_smoothing
        loss = sum(training_loss(logits[k], targets[k], self.task, smoothing) for k in range(self.members))
        self.log("train_loss", loss / self.members, prog_bar=True, on_step=True, on_epoch=False, sync_dist=False)
        return loss

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """Each member's gradient clipped to norm `gradient_clip_val` over its own slice of every parameter."""
        if not gradient_clip_val:
            return
        grads = [p.grad for p in self.stacked if p.grad is not None]
        if not grads:
            return
        norms = torch.stack([g.detach().flatten(1).float().norm(dim=1) for g in grads]).norm(dim=0)  # (K,)
        scale = (gradient_clip_val / (norms + 1e-6)).clamp(max=1.0)  # clip_grad_norm_'s rule
        for g in grads:
            g.mul_(scale.to(g.dtype).view(-1, *([1] * (g.ndim - 1))))

    def configure_optimizers(self):
        cfg = self.train_cfg
        decay, no_decay = [], []
        for name, p in zip(self.names, self.stacked):
            exempt = p.ndim - 1 < 2 or any(k in name for k in NO_DECAY)  # a member's own shape decides
            (no_decay if exempt else decay).append(p)
        on_cuda = all(p.is_cuda for p in self.stacked)
        fused = on_cuda and not fused_clipping_refused(self.trainer.precision_plugin, self.trainer.gradient_clip_val)
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=cfg.lr,
            **({"fused": True} if fused else {}),
        )
        scheduler = warmup_cosine(optimizer, self.trainer.estimated_stepping_batches, cfg.warmup_fraction)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def member_state(self, k: int) -> dict[str, torch.Tensor]:
        """Member k's parameters and buffers by their names in the model, on the CPU."""
        state = {name: p[k].detach().cpu() for name, p in zip(self.names, self.stacked)}
        for i, name in enumerate(self.buffer_names):
            state[name] = getattr(self, f"buffer_{i}")[k].detach().cpu()
        return state


class EnsembleCheckpoint(EpochCheckpoint):
    """EpochCheckpoint of an ensemble: every member's shuffling generator and fetch stream travel in the
    checkpoint and are set back on resume (the loaders are built before the restore, and draw from their
    generators only when iterated)."""

    def __init__(self, path, loaders: list[Any], streams: list[torch.Tensor], setting: str = "cache_dir"):
        super().__init__(path, None, setting)
        self.loaders, self.streams = loaders, streams

    def state_dict(self) -> dict[str, Any]:
        loaders = [loader.generator.get_state() for loader in self.loaders]
        return super().state_dict() | {"loaders": loaders, "streams": list(self.streams)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        for loader, state in zip(self.loaders, state_dict.get("loaders") or []):
            loader.generator.set_state(state)
        self.streams[:] = state_dict.get("streams") or self.streams


class _Called:
    """`base` called with the given parameters and buffers (functional_call), as logits_of calls a model."""

    def __init__(self, base: torch.nn.Module, params: dict, buffers: dict):
        self.base, self.params, self.buffers = base, params, buffers

    def __call__(self, inputs: torch.Tensor):
        return functional_call(self.base, (self.params, self.buffers), (inputs,))
