"""A trainable curve between two factored canonical models A and B (Garipov et al., NeurIPS 2018).

Points are indexed by lam as the straight line's are (lam * A + (1 - lam) * B: lam = 1 at A, 0 at B), with
t = 1 - lam running from A to B along the curve:
  bezier  phi(t) = sum_k C(n+1, k) t^k (1 - t)^(n+1-k) theta_k, theta_0 = A, theta_(n+1) = B; n = 1 is the
          quadratic curve (1 - t)^2 A + 2 t (1 - t) theta + t^2 B
  chain   the polygon A -> theta_1 -> ... -> theta_n -> B, its bends at t = k / (n + 1)
The bends start on the straight line at t = k / (n + 1), so an untrained curve is the straight line (the
Bernstein weights reproduce a linear function), and train on the loss at t ~ U(0, 1) per step, the ends
fixed. Head pairs interpolated as circuits stay circuits: a bend is a point of circuit space, held as the
stacked heads interpolation.merge_params makes, and each point merges ends and bends as the path does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn

from glmc.interpolation import merge_configs, merge_params
from glmc.matching.learned_module import fit_saved_history
from glmc.metrics import loss_and_correct
from glmc.models.canonical import CanonicalTransformer, canonical_forward
from glmc.ranges import check_settings, setting

KINDS = ("bezier", "chain")


@dataclass
class CurveSettings:
    """What shapes and trains a curve; `where` names the config node in errors."""

    kind: str = setting("bezier", choices=KINDS)
    bends: int = setting(1, "count")
    max_steps: int = setting(300, "count")
    lr: float = setting(0.01, "lr")  # SGD with momentum 0.9 and a cosine decay, as Garipov et al. train
    checkpoint_every: int = setting(50, "count")
    seed: int = setting(0, "seed")  # the t of every step
    where: str = "curve"

    def __post_init__(self):
        check_settings(CurveSettings, self.where, vars(self))

    def hashed(self) -> dict[str, Any]:
        """The settings that change the trained bends (a checkpoint's key)."""
        return {"kind": self.kind, "bends": self.bends, "max_steps": self.max_steps, "lr": self.lr, "seed": self.seed}


def node_weights(kind: str, bends: int, lam: float) -> list[float]:
    """The weights of (A, theta_1, ..., theta_n, B) at the point lam (1: A, 0: B)."""
    t, n = 1.0 - float(lam), bends + 1
    if kind == "bezier":
        return [math.comb(n, k) * t**k * (1.0 - t) ** (n - k) for k in range(n + 1)]
    weights = [0.0] * (n + 1)
    k = min(int(t * n), n - 1)  # the segment; t = 1 lies on the last one
    s = t * n - k
    weights[k], weights[k + 1] = 1.0 - s, s
    return weights


def _key(name: str) -> str:
    return name.replace(".", "__")  # ParameterDict keys cannot hold dots


class Curve(L.LightningModule):
    """The bends of a curve between `model_a` and `model_b` (factored canonical, one architecture), as
    Lightning trains them; `circuits`: the head pairs interpolated as circuits. A checkpoint holds the bends,
    the step history and the optimizer, never the ends."""

    def __init__(
        self,
        model_a: CanonicalTransformer,
        model_b: CanonicalTransformer,
        settings: CurveSettings,
        task: str,
        circuits: tuple[str, ...] = (),
    ):
        super().__init__()
        self.settings, self.task, self.circuits = settings, task, tuple(circuits)
        self.configs = (model_a.config, model_b.config)
        self.names = list(model_a.params())
        # plain attributes, not buffers: outside the state dict, so checkpoints never hold the ends
        self._ends = [
            {k: v.detach().clone() for k, v in model_a.params().items()},
            {k: v.detach().clone() for k, v in model_b.params().items()},
        ]
        self.bends = nn.ModuleList()
        with torch.no_grad():
            for k in range(1, settings.bends + 1):  # on the straight line at t = k / (n + 1)
                t = k / (settings.bends + 1)
                point = merge_params(self._ends, [1.0 - t, t], self.circuits)
                self.bends.append(nn.ParameterDict({_key(n): nn.Parameter(point[n].clone()) for n in self.names}))
        # per step: the training loss and its lam; a buffer, so that checkpoints carry it
        self.register_buffer("history", torch.full((settings.max_steps, 2), math.nan))

    @property
    def progress_name(self) -> str:
        """How progress lines name the run (glmc.train.progress_log)."""
        return f"{self.settings.where}={self.settings.kind}"

    def ends(self) -> list[dict[str, Tensor]]:
        if next(iter(self._ends[0].values())).device != self.device:
            self._ends = [{k: v.to(self.device) for k, v in end.items()} for end in self._ends]
        return self._ends

    def nodes(self) -> list[dict[str, Tensor]]:
        """A, the bends, B: the curve's control points (bezier) or vertices (chain)."""
        a, b = self.ends()
        return [a, *({n: bend[_key(n)] for n in self.names} for bend in self.bends), b]

    def params_at(self, lam: float) -> dict[str, Tensor]:
        """The curve's point at lam (1: A, 0: B), differentiable in the bends; the ends' own tensors there."""
        weights = node_weights(self.settings.kind, self.settings.bends, lam)
        kept = [(w, node) for w, node in zip(weights, self.nodes()) if w != 0.0]
        with torch.autocast(self.device.type, enabled=False):  # built in full precision, as a path's points
            return merge_params([node for _, node in kept], [w for w, _ in kept], self.circuits)

    def config_at(self, lam: float):
        """The point's config: A's, with the norm epsilon of the straight line's point where B's differs."""
        return merge_configs(list(self.configs), [lam, 1.0 - lam])

    def point(self, lam: float) -> CanonicalTransformer:
        """The curve's point at lam as a model of its own (lam = 0.5: the curve's midpoint)."""
        with torch.no_grad():
            return CanonicalTransformer(self.config_at(lam), self.params_at(lam))

    def loss(self, inputs: Tensor, targets: Tensor, lam: float) -> Tensor:
        """The mean task loss of the curve's point at lam on one batch."""
        total, _, count = loss_and_correct(
            canonical_forward(self.config_at(lam), self.params_at(lam), inputs), targets, self.task
        )
        return total / count

    def path(self, evaluator: Any, lambdas: list[float]) -> dict[str, list[float]]:
        """Loss and accuracy at every lam by `evaluator` (glmc.eval.evaluator.Evaluator), as a path's."""
        out: dict[str, Any] = {"lambdas": [float(x) for x in lambdas], "loss": [], "accuracy": []}
        for lam in out["lambdas"]:
            loss, accuracy = evaluator.evaluate(self.point(lam))
            out["loss"].append(loss)
            out["accuracy"].append(accuracy)
        return out

    def training_step(self, batch, batch_idx):
        # t is a function of the step alone: equal on every rank and reproduced after a resume
        generator = torch.Generator().manual_seed(self.settings.seed * 1_000_003 + self.global_step)
        lam = torch.rand((), generator=generator, dtype=torch.float64).item()
        loss = self.loss(*batch, lam)
        self.log("curve_loss", loss, prog_bar=True)
        self.log("curve_lambda", lam)
        if self.global_step < len(self.history):
            self.history[self.global_step] = torch.stack([loss.detach(), loss.new_tensor(lam)])
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.bends.parameters(), lr=self.settings.lr, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, self.settings.max_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        fit_saved_history(checkpoint, self.history)

    def steps(self) -> int:
        """The steps trained (over every attempt)."""
        return int((~self.history[:, 0].isnan()).sum())
