"""Several endpoints of one architecture trained as one batched model (train.ensemble): their parameters
stacked along a new leading axis (member k at index k), one vmapped forward and backward for all. Each
member keeps its own initial weights, data order (its own loader, zipped with the others), the random
stream its fetches draw from (masked-LM masks: torch's global one for a seed alone), AdamW state
(AdamW is elementwise, so one AdamW over the stacked tensors is K independent ones), warmup_cosine
schedule and gradient-norm clipping (per member, as torch.nn.utils.clip_grad_norm_ computes it).

Dropout draws each member's own masks (vmap randomness="different"), from one shared generator: not
the masks a separate run draws, so only with dropout 0 does a member equal its separate run (within
the round-off of sums taken in another order; attention and linear layers on a CPU and experts everywhere
are folded: glmc.train.folded_attention, glmc.train.folded_linear and glmc.train.folded_experts).

Validation runs when a seed alone's does (each member's val loss logged as member_<k>/val_loss, computed as
a seed alone's val_loss is); with early stopping (MemberStopping) each member keeps its lowest-val-loss
epoch's state and stops counting after `patience` validations without improvement (from then on it is left
out of the stacked forward, backward and validation), and the fit ends when every member has stopped. A
spawned child's members (`start`) continue a parent's training state."""

from __future__ import annotations

import contextlib
import functools
import math
from typing import Any

import lightning as L
import torch
from torch.func import functional_call, stack_module_state

from glmc.config import TrainConfig
from glmc.metrics import logits_of, loss_and_correct
from glmc.train.endpoint import (
    SpawnPoint,
    adamw_with_schedule,
    continue_schedule,
    fused_adamw_suits,
    training_loss,
)
from glmc.train.folded_attention import FoldedAttention
from glmc.train.folded_experts import FoldedExperts
from glmc.train.folded_linear import FoldedLinear
from glmc.train.resume import EpochCheckpoint


def drawn_in(streams: list[torch.Tensor], k: int, draw) -> Any:
    """`draw()` drawing from stream k in place of torch's global generator (no streams: from the global one);
    the stream is advanced in place."""
    if not streams:
        return draw()
    outside = torch.get_rng_state()
    torch.set_rng_state(streams[k])
    try:
        return draw()
    finally:
        streams[k] = torch.get_rng_state()
        torch.set_rng_state(outside)


class ZippedBatches:
    """The members' own training loaders in step: each batch is theirs stacked along a new first axis.
    `streams`: each member's CPU random state, what its fetches draw from in place of torch's global one
    (masked-LM training masks are drawn at every fetch, and a loader without a generator of its own, a
    spawned child's, draws its workers' seed there when iterated); updated in place, so that it can be
    checkpointed."""

    def __init__(self, loaders: list[Any], streams: list[torch.Tensor]):
        self.loaders, self.streams = loaders, streams

    def __len__(self) -> int:
        return min(len(loader) for loader in self.loaders)

    def __iter__(self):
        iterators = [
            drawn_in(self.streams, k, functools.partial(iter, loader)) for k, loader in enumerate(self.loaders)
        ]
        while True:
            batches = []
            for k, iterator in enumerate(iterators):
                batch = drawn_in(self.streams, k, functools.partial(next, iterator, None))
                if batch is None:
                    return
                batches.append(batch)
            yield tuple(torch.stack(parts) for parts in zip(*batches))


class MemberStopping:
    """Each member's early stopping and best epoch, as a seed alone's EarlyStopping(monitor="val_loss",
    patience) and BestEpochWeights decide them: a finite val loss below the member's best is its new best
    (its state kept, a CPU copy) and resets its count; any other counts one, and `patience` of them in a
    row, or a non-finite val loss, stop it (its later validations no longer count)."""

    def __init__(self, members: int, patience: int):
        self.patience = patience
        self.best_loss = [math.inf] * members
        self.best_epoch: list[int | None] = [None] * members
        self.best_state: list[dict[str, torch.Tensor] | None] = [None] * members
        self.waits = [0] * members
        self.stopped = [False] * members

    def record(self, k: int, loss: float, epoch: int, state) -> None:
        """Member k's val loss after `epoch` (1-based); `state()` gives its state, called where it is kept."""
        if self.stopped[k]:
            return
        if not math.isfinite(loss):
            self.stopped[k] = True
        elif loss < self.best_loss[k]:
            self.best_loss[k], self.best_epoch[k], self.best_state[k] = loss, epoch, state()
            self.waits[k] = 0
        else:
            self.waits[k] += 1
            self.stopped[k] = self.waits[k] >= self.patience

    def kept(self, k: int) -> dict[str, Any] | None:
        """Which epoch's weights member k keeps, as BestEpochWeights.kept says it (None: its last ones)."""
        if self.best_epoch[k] is None:
            return None
        return {"epoch": self.best_epoch[k], "val_loss": self.best_loss[k]}

    def state_dict(self) -> dict[str, Any]:
        fields = ("best_loss", "best_epoch", "best_state", "waits", "stopped")
        return {name: list(getattr(self, name)) for name in fields}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            setattr(self, name, list(value))


class EnsembleModule(L.LightningModule):
    """`models`: the members, each built as it would be alone; `base`: one more of the same architecture
    (on the meta device, so that it holds no memory) whose structure, tied weights included, the stacked
    parameters are called through. `start`: the training state every member continues (spawned children:
    each model a copy of its model); `stopping`: the members' early stopping, None without."""

    def __init__(
        self,
        models: list[torch.nn.Module],
        base: torch.nn.Module,
        train_cfg: TrainConfig,
        task: str,
        start: SpawnPoint | None = None,
    ):
        super().__init__()
        params, buffers = stack_module_state(models)
        self.names = list(params)
        self.stacked = torch.nn.ParameterList(torch.nn.Parameter(params[name]) for name in self.names)
        self.buffer_names = list(buffers)
        for i, name in enumerate(self.buffer_names):
            self.register_buffer(f"buffer_{i}", buffers[name])
        object.__setattr__(self, "base", base)  # not a submodule: it holds no weights of its own
        object.__setattr__(self, "start", start)
        self.members, self.train_cfg, self.task = len(models), train_cfg, task
        self.train_loaders: list[Any] = []
        self.val_loader: Any = None
        self.fetch_streams: list[torch.Tensor] = []  # see ZippedBatches
        self.stopping: MemberStopping | None = None
        if train_cfg.early_stopping_patience is not None:
            self.stopping = MemberStopping(len(models), train_cfg.early_stopping_patience)

    def forward(self, inputs: torch.Tensor, members: torch.Tensor | None = None) -> torch.Tensor:
        """Every member's logits of its own inputs: (K, ...) in, (K, ...) out; with `members` (indices), those
        members' only, inputs (len(members), ...)."""
        buffers = {name: getattr(self, f"buffer_{i}") for i, name in enumerate(self.buffer_names)}
        params = dict(zip(self.names, self.stacked))
        if members is not None:  # the others are not computed (their gradients come out zero)
            params = {name: p.index_select(0, members) for name, p in params.items()}
            buffers = {name: b.index_select(0, members) for name, b in buffers.items()}
        self.base.train(self.training)  # dropout as this module's mode says (Lightning sets it, not the base's)

        def one(p, b, x):
            return logits_of(_Called(self.base, p, b), x)

        with contextlib.ExitStack() as folding:
            folding.enter_context(FoldedExperts())  # grouped expert products have no batching rule anywhere
            if inputs.device.type == "cpu":  # SDPA's CUDA kernels have batching rules, its CPU kernel none
                folding.enter_context(FoldedAttention())
                folding.enter_context(FoldedLinear())  # bias in the product, gradients in the weights' layout
            return torch.vmap(one, randomness="different")(params, buffers, inputs)

    def train_dataloader(self) -> ZippedBatches:
        return ZippedBatches(self.train_loaders, self.fetch_streams)

    def val_dataloader(self) -> Any:
        return self.val_loader

    def active_members(self) -> list[int]:
        """The members still training: a stopped one's kept state is taken, and it is no longer computed (nor
        may its further training end the others'); all of them where none is left."""
        stopped = self.stopping.stopped if self.stopping else [False] * self.members
        return [k for k in range(self.members) if not stopped[k]] or list(range(self.members))

    def _members_logits(self, inputs: torch.Tensor, members: list[int]) -> torch.Tensor:
        if len(members) == self.members:
            return self(inputs)
        index = torch.tensor(members, device=inputs.device)
        return self(inputs.index_select(0, index), index)

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        training = self.active_members()
        logits = self._members_logits(inputs, training)
        # the sum of the members' mean losses: each member's gradient is its own loss's
        smoothing = self.train_cfg.label_smoothing
        each = functools.partial(training_loss, task=self.task, label_smoothing=smoothing)
        if len(training) < self.members:
            targets = targets[training]
        loss = torch.vmap(each)(logits, targets).sum()  # one batched loss, not a kernel per member
        self.log("train_loss", loss / len(training), prog_bar=True, on_step=True, on_epoch=False, sync_dist=False)
        return loss

    def on_validation_start(self) -> None:
        # a seed alone's validation loader, without a generator of its own, draws its workers' seed from
        # torch's global generator when iterated: the member's stream advances as that one does
        for k in range(len(self.fetch_streams)):
            drawn_in(self.fetch_streams, k, lambda: torch.empty((), dtype=torch.int64).random_())

    def validation_step(self, batch, batch_idx):
        inputs, targets = batch
        validating = self.active_members()  # a stopped member's validations no longer count
        logits = self._members_logits(inputs.expand(self.members, *inputs.shape), validating)
        for row, k in enumerate(validating):  # as EndpointModule.validation_step logs a seed alone's val_loss
            loss, _, count = loss_and_correct(logits[row], targets, self.task)
            count = int(count)
            self.log(f"member_{k}/val_loss", loss / count, batch_size=count)

    def on_validation_end(self) -> None:
        if self.stopping is None or self.trainer.sanity_checking:
            return
        for k in self.active_members():
            loss = float(self.trainer.callback_metrics[f"member_{k}/val_loss"])
            self.stopping.record(k, loss, self.trainer.current_epoch + 1, functools.partial(self.member_state, k))
        if all(self.stopping.stopped):
            self.trainer.should_stop = True

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
        named = [(name, p, p.ndim - 1) for name, p in zip(self.names, self.stacked)]  # a member's own shape
        fused = fused_adamw_suits(self.stacked, self)
        total = self.trainer.estimated_stepping_batches if self.start is None else self.start.total
        optimizer, scheduler = adamw_with_schedule(self.train_cfg, named, fused, total)
        if self.start is not None:
            self._continue(optimizer, scheduler)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def _continue(self, optimizer: torch.optim.Optimizer, scheduler) -> None:
        """AdamW and its schedule where the parent's stood at `start` (glmc.train.endpoint.continue_from),
        each member's slice of every moment the parent's."""
        point = self.start
        if point.step:
            index = {name: i for i, (name, _) in enumerate(point.model.named_parameters())}
            name_of = {id(p): name for name, p in zip(self.names, self.stacked)}
            ordered = [p for group in optimizer.param_groups for p in group["params"]]  # state_dict's numbering
            saved, step = optimizer.state_dict(), torch.tensor(float(point.step))
            saved["state"] = {}
            for n, p in enumerate(ordered):
                moments = point.moments(index[name_of[id(p)]])
                stacked = {key: m.expand(self.members, *m.shape).clone() for key, m in moments.items()}
                saved["state"][n] = {"step": step.clone(), **stacked}
            optimizer.load_state_dict(saved)
        continue_schedule(point.step, optimizer, scheduler)

    def member_state(self, k: int) -> dict[str, torch.Tensor]:
        """Member k's parameters and buffers by their names in the model: a copy on the CPU."""
        state = {name: p[k].detach().to("cpu", copy=True) for name, p in zip(self.names, self.stacked)}
        for i, name in enumerate(self.buffer_names):
            state[name] = getattr(self, f"buffer_{i}")[k].detach().to("cpu", copy=True)
        return state

    def kept_state(self, k: int) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None]:
        """Member k's state to keep and which epoch's it is: with early stopping its lowest val loss's (as
        BestEpochWeights restores it), else (or where no val loss was finite) its last, with None."""
        kept = None if self.stopping is None else self.stopping.kept(k)
        return (self.member_state(k), None) if kept is None else (self.stopping.best_state[k], kept)


class EnsembleCheckpoint(EpochCheckpoint):
    """EpochCheckpoint of an ensemble: every member's place in its data order (its shuffling generator, or
    a spawned child's step-sampler position), fetch stream and early-stopping state (MemberStopping) travel
    in the checkpoint and are set back on resume (the loaders are built before the restore, and draw from
    their generators only when iterated)."""

    def __init__(
        self,
        path,
        loaders: list[Any],
        streams: list[torch.Tensor],
        stopping: MemberStopping | None = None,
        setting: str = "cache_dir",
    ):
        super().__init__(path, None, setting)
        self.loaders, self.streams, self.stopping = loaders, streams, stopping

    def state_dict(self) -> dict[str, Any]:
        loaders = [_order_state(loader) for loader in self.loaders]
        stopping = None if self.stopping is None else self.stopping.state_dict()
        return super().state_dict() | {"loaders": loaders, "streams": list(self.streams), "stopping": stopping}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        for loader, state in zip(self.loaders, state_dict.get("loaders") or []):
            if isinstance(state, int):
                loader.sampler.next_step = state
            else:
                loader.generator.set_state(state)
        self.streams[:] = state_dict.get("streams") or self.streams
        if self.stopping is not None and state_dict.get("stopping"):
            self.stopping.load_state_dict(state_dict["stopping"])


def _order_state(loader: Any) -> torch.Tensor | int:
    """Where a member's loader stands in its data order: its generator's state, or (a step-sampled order,
    glmc.data.step_sampler) the next batch step."""
    return loader.sampler.next_step if loader.generator is None else loader.generator.get_state()


class _Called:
    """`base` called with the given parameters and buffers (functional_call), as logits_of calls a model."""

    def __init__(self, base: torch.nn.Module, params: dict, buffers: dict):
        self.base, self.params, self.buffers = base, params, buffers

    def __call__(self, inputs: torch.Tensor):
        return functional_call(self.base, (self.params, self.buffers), (inputs,))
