"""Learned matching as a LightningModule (paper 001 §4.2, Algorithm 1; Appendix D for Sinkhorn).

The only parameters are one latent matrix per symmetry space, so DDP syncs their gradients and a
checkpoint holds the latents and the optimizer, never the endpoints. Every step projects the
latents (straight-through Hungarian, polar factor or Sinkhorn), applies the matrices to model B's
canonical params, interpolates with model A at a sampled lambda and runs the functional forward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import lightning as L
import torch
from torch import Tensor, nn

from glmc.choices import LambdaScheme
from glmc.interpolation import merge_configs, merge_params
from glmc.matching.engine.assignment import assign_layers
from glmc.matching.engine.device_assignment import DeviceAssignments
from glmc.matching.engine.projections import polar, sinkhorn, sinkhorn_latent, straight_through_permutation
from glmc.matching.engine.warm_assignment import WarmAssignments
from glmc.matching.latent_apply import LatentApplier
from glmc.metrics import loss_and_correct
from glmc.models.canonical import CanonicalTransformer, canonical_forward
from glmc.ranges import check_settings
from glmc.schedule import warmup_cosine
from glmc.settings.groups import LearnedTraining
from glmc.symmetry import Orthogonal, Permutation, SymmetrySpec, Transform, apply_dense

KINDS = ("orthogonal", "permutation", "sinkhorn")


def fit_saved_history(checkpoint: dict, history: Tensor) -> None:
    """A checkpoint's per-step history buffer resized to `history`'s steps (NaN beyond the saved ones): a
    resumed run may train for more steps than the interrupted one planned."""
    saved = checkpoint["state_dict"].get("history")
    if saved is not None and saved.shape != history.shape:
        resized = torch.full_like(history, math.nan)
        n = min(len(saved), len(resized))
        resized[:n] = saved[:n]
        checkpoint["state_dict"]["history"] = resized


@dataclass
class LearnedSettings(LearnedTraining):
    """Learned matching's training settings (glmc.settings.groups.LearnedTraining), range-checked;
    `where` names the config node in errors."""

    where: str = "matcher.learned"

    def __post_init__(self):
        check_settings(LearnedTraining, self.where, vars(self))
        self.lambda_scheme = str(self.lambda_scheme)


def sample_lambda(scheme: str, generator: torch.Generator) -> float:
    """Paper 001 Appendix C.1.1: 0.5; U[0.4, 0.6]; U[0, 1]; N(0.5, 0.1) clipped to [0, 1]; ours: the
    arcsine law sin^2(pi u / 2), which draws the path's ends more often."""
    if scheme == "fixed":
        return 0.5
    if scheme == "uniform_mid":
        return 0.4 + 0.2 * torch.rand((), generator=generator, dtype=torch.float64).item()
    if scheme == "uniform":
        return torch.rand((), generator=generator, dtype=torch.float64).item()
    if scheme == "gaussian":
        return min(1.0, max(0.0, 0.5 + 0.1 * torch.randn((), generator=generator, dtype=torch.float64).item()))
    if scheme == "arcsine":
        return math.sin(0.5 * math.pi * torch.rand((), generator=generator, dtype=torch.float64).item()) ** 2
    raise ValueError(f"lambda_scheme={scheme!r} is not one of {', '.join(LambdaScheme)}")


def full_precision(device: torch.device):
    """Autocast off while the merged parameters are built, so that under mixed precision only the
    merged model's forward runs in half, as an endpoint's does."""
    return torch.autocast(device.type, enabled=False)


@torch.no_grad()
def worst_draw(
    config, task: str, circuits, members: list[dict[str, Tensor]], inputs, targets, candidates, configs=None
) -> int:
    """Index of the candidate merge coefficients whose loss on this batch lies furthest above the members'
    losses combined by them (Eq. 2's excess). `configs`: one per member where norm_eps may differ."""
    configs = configs or [config] * len(members)
    ends = [batch_loss(c, task, params, inputs, targets) for c, params in zip(configs, members)]
    with full_precision(inputs.device):
        merged = [merge_params(members, c, circuits) for c in candidates]
    excess = [
        batch_loss(merge_configs(configs, c), task, params, inputs, targets) - sum(ci * li for ci, li in zip(c, ends))
        for c, params in zip(candidates, merged)
    ]
    return max(range(len(candidates)), key=excess.__getitem__)


def batch_loss(config, task: str, params: dict[str, Tensor], inputs, targets) -> float:
    """The mean loss of the canonical model `params` on one batch, as a float."""
    total, _, count = loss_and_correct(canonical_forward(config, params, inputs), targets, task)
    return float(total.detach()) / count


def latent_key(space: str) -> str:
    return space.replace(".", "_")  # ParameterDict keys cannot hold dots


# latents of A's own transform (learned_dual) are keyed by this prefix and the space's key
REFERENCE = "reference_"


def nonfinite_latent(latents: nn.ParameterDict) -> str | None:
    """Which latent holds NaN or infinite values, and how many; None when all are finite."""
    for key, z in latents.items():
        bad = int((~torch.isfinite(z.detach())).sum())
        if bad:
            return f"latent {key} has {bad} NaN/inf values of {z.numel()}"
    return None


def _first_line(err: BaseException) -> str:
    name = type(err).__name__.lstrip("_")  # torch's _LinAlgError is torch.linalg.LinAlgError
    return f"{name}: {(str(err).strip().splitlines() or [''])[0][:200]}"


class DivergenceStop:
    """Hooks that stop training cleanly at the first non-finite loss or latent, or failed projection,
    for a LightningModule with `latents` and `history` (per step: the loss, then the step's draws).
    `divergence()` reads the same from history and latents after fit (ddp_spawn returns only those)."""

    diverged: tuple[int, str] | None = None

    def stop_diverged(self, step: int, what: str) -> None:
        if self.diverged is None:
            self.diverged = (step, what)
        self.trainer.should_stop = True

    def projection_failed(self, err: BaseException, draws: list[float]) -> None:
        """The latents could not be projected: the step is recorded with a NaN loss, and not taken."""
        step = self.global_step
        if step < len(self.history):
            self.history[step] = torch.tensor([math.nan, *draws], dtype=self.history.dtype)
        self.stop_diverged(step, f"the projection of the latents failed ({_first_line(err)})")

    def on_train_start(self) -> None:
        what = nonfinite_latent(self.latents)
        if what is not None:  # the step before the checkpoint made them so
            self.stop_diverged(max(self.global_step - 1, 0), what)

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        ok = torch.stack([torch.isfinite(z.detach()).all() for z in self.latents.values()]).all()
        if isinstance(loss, Tensor):
            ok = ok & torch.isfinite(loss.detach()).all()
        bad = self.diverged is not None or not bool(ok)
        # every process decides alike, so that all of them stop at the same step
        if not self.trainer.strategy.reduce_boolean_decision(bad, all=False):
            return
        what = None
        if isinstance(loss, Tensor) and not torch.isfinite(loss.detach()).all():
            what = f"the loss is {float(loss.detach().float().sum())}"
        self.stop_diverged(self.global_step - 1, what or nonfinite_latent(self.latents) or "another process diverged")

    def divergence(self) -> tuple[int, str] | None:
        """(step, what) of the first divergence of the trained latents, None if there was none."""
        if self.diverged is not None:
            return self.diverged
        history = self.history.detach().cpu()
        ran = ~history[:, 1].isnan()
        bad = (ran & ~torch.isfinite(history[:, 0])).nonzero()
        if len(bad):
            step = int(bad[0])
            return step, f"the loss is {float(history[step, 0])}"
        what = nonfinite_latent(self.latents)
        return None if what is None else (max(int(ran.sum()) - 1, 0), what)


class LearnedMatchingModule(DivergenceStop, L.LightningModule):
    """Latents for the spaces in `kinds` (space name -> orthogonal | permutation | sinkhorn), started at
    `init`'s dense matrices plus noise; `circuits`: the pairs interpolated as circuits. `reference_init`
    (learned_dual): starts of A's own transform T_A, so the path runs from T_A(theta_A) to T(theta_B)."""

    def __init__(
        self,
        model_a: CanonicalTransformer,
        model_b: CanonicalTransformer,
        init: dict[str, Tensor],
        kinds: dict[str, str],
        settings: LearnedSettings,
        task: str,
        circuits: tuple[str, ...] = ("qk", "vo"),
        reference_init: dict[str, Tensor] | None = None,
    ):
        super().__init__()
        if model_a.config.form != "factored" or model_b.config.form != "factored":
            raise ValueError("learned matching transforms factored heads: pass models before .to_circuit()")
        bad = {n: k for n, k in kinds.items() if k not in KINDS}
        if bad:
            raise ValueError(f"unknown latent kinds {bad}; known: {KINDS}")
        self.config = model_a.config
        self.config_b = model_b.config  # a narrower B embedded with its stream kept has its own norm_eps
        self.spec = SymmetrySpec.from_model(model_b)
        self.kinds = dict(kinds)
        self.settings = settings
        self.task = task
        self.circuits = tuple(circuits)
        # Plain attributes, not buffers: outside the state dict (checkpoints hold latents only) and
        # not broadcast by DDP every step (every rank unpickles the same tensors).
        self._endpoints = {
            "a": {k: v.detach().clone() for k, v in model_a.params().items()},
            "b": {k: v.detach().clone() for k, v in model_b.params().items()},
        }
        generator = torch.Generator().manual_seed(settings.seed)
        self.latents = nn.ParameterDict()
        for name, kind in self.kinds.items():
            start = init[name].detach().float()
            if kind == "sinkhorn":
                z = sinkhorn_latent(start, settings.sinkhorn_noise, settings.sinkhorn_temperature, generator)
            else:
                z = start + settings.init_noise * torch.randn(start.shape, generator=generator)
            self.latents[latent_key(name)] = nn.Parameter(z)
        # A's side after B's, so that B's latents start as they do without it
        self.reference_spaces = list(reference_init or {})
        for name in self.reference_spaces:
            start = reference_init[name].detach().float()
            z = start + settings.init_noise * torch.randn(start.shape, generator=generator)
            self.latents[REFERENCE + latent_key(name)] = nn.Parameter(z)
        self._reference_applier: LatentApplier | None = None
        self._applier: LatentApplier | None = None  # built on first use, on the latents' device
        self._kept = WarmAssignments()  # the last hard permutations, kept while still optimal
        self._auction = DeviceAssignments()  # the same on the device: the last answers and their prices
        self.keep_assignments = True  # False: the solver every step (the earlier path, the same answers)
        self.dense_apply = False
        # per optimisation step: training loss and lambda; a buffer so that checkpoints and the
        # spawn launcher (which returns the state dict) carry it
        self.register_buffer("history", torch.full((settings.max_steps, 2), math.nan))

    @property
    def progress_name(self) -> str:
        """How progress lines name the run (glmc.train.progress_log): the matcher's config node."""
        return self.settings.where

    def endpoint_params(self, which: str) -> dict[str, Tensor]:
        params = self._endpoints[which]
        if next(iter(params.values())).device != self.device:
            params = self._endpoints[which] = {k: v.to(self.device) for k, v in params.items()}
        return params

    def _latent_keys(self, side: str) -> dict[str, str]:
        """Space name -> latent key of B's transform (`b`) or of A's (`a`, learned_dual)."""
        if side == "b":
            return {n: latent_key(n) for n in self.kinds}
        return {n: REFERENCE + latent_key(n) for n in self.reference_spaces}

    def elements(self, side: str = "b") -> dict[str, Tensor | tuple[Tensor, Tensor]]:
        """The projected latents as LatentApplier takes them: straight-through permutations as
        (latent, hard index), the others as dense matrices; B's transform's, or A's (`side="a"`)."""
        s, out, keys = self.settings, {}, self._latent_keys(side)
        kinds = {n: self.kinds[n] for n in keys}
        tag = "" if side == "b" else REFERENCE  # the kept assignments of the two sides apart
        straight = {n: self.latents[keys[n]].detach() for n, k in kinds.items() if k == "permutation"}
        hard = self.hard_permutations(straight, tag)
        for name, kind in kinds.items():
            z = self.latents[keys[name]]
            if kind == "orthogonal":
                out[name] = polar(z)
            elif kind == "permutation":
                out[name] = (z, hard[name].perm.to(z.device))
            else:
                out[name] = sinkhorn(z, s.sinkhorn_iters, s.sinkhorn_temperature)
        return out

    def hard_permutations(self, straight: dict[str, Tensor], tag: str = "") -> dict[str, Permutation]:
        """The hard permutation of each detached straight-through latent: its rows' maxima when distinct,
        else the device auction (`on_device`), else SciPy. `tag` keeps A's and B's answers apart."""
        hard = {n: Permutation.from_row_maxima(z) for n, z in straight.items()}
        solve = [n for n, p in hard.items() if p is None]
        if self.on_device(straight):
            for name, p in hard.items():
                if p is not None:  # the next auction starts from this step's answer
                    self._auction.remember(tag + name, p)
            found = self._auction.project(
                {tag + n: straight[n] for n in solve if straight[n].shape[0] == straight[n].shape[1]}
            )
            hard.update({n: found[tag + n] for n in solve if tag + n in found})
            solve = [n for n in solve if tag + n not in found]
        # the rest: the last answer where certified still optimal, else SciPy, side by side
        if self.keep_assignments:
            project = lambda i: self._kept.project(tag + solve[i], straight[solve[i]])  # noqa: E731
        else:
            project = lambda i: Permutation.project(straight[solve[i]])  # noqa: E731
        hard.update(zip(solve, assign_layers(project, range(len(solve)))))
        return hard

    def on_device(self, straight: dict[str, Tensor]) -> bool:
        """Whether hard permutations are solved on the latents' device (settings.assignment)."""
        mode = str(self.settings.assignment)
        return mode == "device" or (mode == "auto" and any(z.device.type == "cuda" for z in straight.values()))

    def matrices(self) -> dict[str, Tensor]:
        """The projected latents, dense and differentiable."""
        s, out = self.settings, {}
        straight = {n: self.latents[latent_key(n)].detach() for n, k in self.kinds.items() if k == "permutation"}
        hard = self.hard_permutations(straight) if self.on_device(straight) else {}
        for name, kind in self.kinds.items():
            z = self.latents[latent_key(name)]
            if kind == "orthogonal":
                out[name] = polar(z)
            elif kind == "permutation":
                out[name] = straight_through_permutation(z, hard[name].perm if name in hard else None)
            else:
                out[name] = sinkhorn(z, s.sinkhorn_iters, s.sinkhorn_temperature)
        return out

    def aligned_params(self) -> dict[str, Tensor]:
        """T(theta_B) in factored form, inside the graph: by LatentApplier, or with `dense_apply` by
        apply_dense (the same values and gradients, more work)."""
        if self.dense_apply:
            return apply_dense(self.matrices(), self.spec, self.endpoint_params("b"))
        if self._applier is None:
            dense = self.kinds.get("residual") == "orthogonal"
            self._applier = LatentApplier(self.spec, self.endpoint_params("b"), list(self.kinds), dense)
        return self._applier.to(self.device)(self.elements())

    def reference_params(self) -> dict[str, Tensor]:
        """The path's other end: theta_A, or T_A(theta_A) inside the graph where A's side is learned."""
        if not self.reference_spaces:
            return self.endpoint_params("a")
        if self._reference_applier is None:
            dense = "residual" in self.reference_spaces and self.kinds["residual"] == "orthogonal"
            # A has B's architecture (learned_dual checks it), so B's spaces act on A's tensors
            self._reference_applier = LatentApplier(self.spec, self.endpoint_params("a"), self.reference_spaces, dense)
        return self._reference_applier.to(self.device)(self.elements("a"))

    def loss(
        self,
        inputs: Tensor,
        targets: Tensor,
        lam: float,
        aligned: dict[str, Tensor] | None = None,
        reference: dict[str, Tensor] | None = None,
    ) -> Tensor:
        """Task loss of lam * theta_A + (1 - lam) * T(theta_B) on one batch (`aligned`: T(theta_B) when
        already built; `reference`: reference_params when already built)."""
        total, count = self._summed_loss(inputs, targets, lam, aligned, reference)
        return total / count

    def _summed_loss(
        self,
        inputs: Tensor,
        targets: Tensor,
        lam: float,
        aligned: dict[str, Tensor] | None = None,
        reference: dict[str, Tensor] | None = None,
    ) -> tuple[Tensor, int]:
        with full_precision(self.device):
            aligned = self.aligned_params() if aligned is None else aligned
            reference = self.reference_params() if reference is None else reference
            params = merge_params([reference, aligned], [lam, 1.0 - lam], self.circuits)
        total, _, count = loss_and_correct(canonical_forward(self.path_config(lam), params, inputs), targets, self.task)
        return total, count

    def path_config(self, lam: float):
        """The config of lam * A + (1 - lam) * B: A's, with the norm epsilon interpolated where B's differs."""
        return merge_configs([self.config, self.config_b], [lam, 1.0 - lam])

    def worst_lambda(
        self, inputs: Tensor, targets: Tensor, candidates: list[float], aligned: dict[str, Tensor] | None = None
    ) -> float:
        """The candidate whose loss on this batch lies furthest above the straight line between the
        endpoints' losses on it: the barrier's own measure, so that steps go where the path is worst."""
        with torch.no_grad(), full_precision(self.device):
            aligned = self.aligned_params() if aligned is None else {k: v.detach() for k, v in aligned.items()}
            members = [{k: v.detach() for k, v in self.reference_params().items()}, aligned]
        coefficients = [[lam, 1.0 - lam] for lam in candidates]
        configs = [self.config, self.config_b]
        worst = worst_draw(self.config, self.task, self.circuits, members, inputs, targets, coefficients, configs)
        return candidates[worst]

    def drawn_loss(self, inputs: Tensor, targets: Tensor, candidates: list[float]) -> tuple[Tensor, float]:
        """The loss at the worst of `candidates` (as worst_lambda chooses), and that lambda; T(theta_B) is
        built once and each candidate's loss computed once, in the graph."""
        with full_precision(self.device):
            aligned, reference = self.aligned_params(), self.reference_params()
        if len(candidates) == 1:
            return self.loss(inputs, targets, candidates[0], aligned, reference), candidates[0]
        with torch.no_grad():  # the endpoints' losses, as worst_draw takes them
            members = tuple({k: v.detach() for k, v in p.items()} for p in (reference, aligned))
            ends = [batch_loss(c, self.task, p, inputs, targets) for c, p in zip((self.config, self.config_b), members)]
        best, worst = -math.inf, None
        for lam in candidates:
            total, count = self._summed_loss(inputs, targets, lam, aligned, reference)
            excess = float(total.detach()) / count - (lam * ends[0] + (1.0 - lam) * ends[1])
            if excess > best:
                best, worst = excess, (total / count, lam)
        return worst

    def training_step(self, batch, batch_idx):
        # the draws depend on the step alone: equal on every rank and reproduced after a resume; with
        # several candidates each rank keeps the worst on its own batch
        s = self.settings
        generator = torch.Generator().manual_seed(s.seed * 1_000_003 + self.global_step)
        candidates = [sample_lambda(s.lambda_scheme, generator) for _ in range(s.lambda_candidates)]
        try:
            loss, lam = self.drawn_loss(*batch, candidates)
        except torch.linalg.LinAlgError as err:
            self.projection_failed(err, [candidates[0]])
            return None
        self.log("match_loss", loss, prog_bar=True)
        # the epoch's mean beside the per-step value (a separate key: `match_loss` keeps its name)
        self.log("match_loss_epoch", loss, on_step=False, on_epoch=True, sync_dist=True)
        self.log("lambda", lam)
        if self.global_step < len(self.history):
            self.history[self.global_step] = torch.stack([loss.detach(), loss.new_tensor(lam)])
        return loss

    def on_train_epoch_end(self) -> None:
        """Logs `match_test_loss`, the midpoint's loss on the first `epoch_test_batches` test batches
        (-1: all; 0: off; needs a DataModule), leaving the training trajectory unchanged."""
        n = self.settings.epoch_test_batches
        datamodule = getattr(self.trainer, "datamodule", None)
        if n == 0 or datamodule is None or not hasattr(datamodule, "test_dataloader") or self.diverged:
            return
        total, count = 0.0, 0
        # a DataLoader draws its seed from the global generator: fork it so later epochs see the same draws
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            params = merge_params([self.reference_params(), self.aligned_params()], [0.5, 0.5], self.circuits)
            for i, (inputs, targets) in enumerate(datamodule.test_dataloader()):
                if i == n:
                    break
                inputs, targets = inputs.to(self.device), targets.to(self.device)
                logits = canonical_forward(self.path_config(0.5), params, inputs)
                loss, _, counted = loss_and_correct(logits, targets, self.task)
                total, count = total + float(loss), count + int(counted)
        if count:
            # every rank evaluates the same batches: nothing to reduce
            self.log("match_test_loss", total / count, on_step=False, on_epoch=True)

    def configure_optimizers(self):
        s = self.settings
        optimizer = torch.optim.AdamW(self.latents.parameters(), lr=s.lr, weight_decay=s.weight_decay)
        scheduler = warmup_cosine(optimizer, self.trainer.estimated_stepping_batches, s.warmup_fraction)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        fit_saved_history(checkpoint, self.history)

    @torch.no_grad()
    def hard_transform(self, side: str = "b") -> Transform:
        """The final group elements of B's transform (or A's, `side="a"`): Hungarian for permutation and
        Sinkhorn latents (the most likely permutation under the soft one), U V^T for orthogonal."""
        out = Transform()
        for name, key in self._latent_keys(side).items():
            kind = self.kinds[name]
            z = self.latents[key].detach().cpu().double()
            out[name] = Orthogonal.project(z) if kind == "orthogonal" else Permutation.project(z)
        return out
