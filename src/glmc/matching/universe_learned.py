"""Learned refinement of universe matching (paper 001 §4.3): train the symmetries of N models already
aligned to a common universe on the task loss of the merged models over the simplex.

Model 0 stays fixed (a transform applied to all alike changes nothing); models 1..N-1 get one latent
per space their universe transform acts on (polar factor or straight-through permutation), started at
the identity plus noise. Each step minimises the loss of sum_i alpha_i T_i(theta_i) with alpha drawn
from a generator seeded by (seed, step): equal on every DDP rank and after a resume. Checkpoints live
under <run_dir>/universe_<hash>. The result holds models[i] = apply(refinement_i, universe model i) and
transforms[i] = (universe transform_i, refinement_i).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from typing import Any

import lightning as L
import numpy as np
import torch
from torch import Tensor, nn

from glmc.interpolation import interpolate, merge_params
from glmc.matching.base import MatchContext, require_factored, settings_hash
from glmc.matching.engine.projections import polar, straight_through_permutation
from glmc.matching.learned import changes_from, finite_list
from glmc.matching.learned_module import DivergenceStop, LearnedMatchingModule, full_precision, latent_key, worst_draw
from glmc.matching.universe import UniverseAlignment
from glmc.metrics import loss_and_correct
from glmc.models.canonical import CanonicalTransformer, canonical_forward
from glmc.ranges import check_settings
from glmc.settings.groups import UniverseTraining
from glmc.symmetry import (
    Diagonal,
    Orthogonal,
    Permutation,
    SemiPermutation,
    SymmetrySpec,
    Transform,
    apply,
    apply_dense,
)

log = logging.getLogger(__name__)


@dataclass
class UniverseLearnedSettings(UniverseTraining):
    """The refinement's training settings (glmc.settings.groups.UniverseTraining), range-checked; `where`
    names the config node in errors."""

    where: str = "universe.learned"

    def __post_init__(self):
        check_settings(UniverseTraining, self.where, vars(self))


def sample_alpha(
    n_models: int,
    concentration: float,
    seed: int,
    step: int,
    edge_share: float = UniverseTraining.edge_share,
    edge_lambda: str = UniverseTraining.edge_lambda,
    draw: int = 0,
) -> list[float]:
    """Merge coefficients ~ Dirichlet(concentration * 1), or with probability `edge_share` a point
    on a uniformly chosen edge (`edge_lambda`: uniform, or gaussian around its midpoint); a function
    of (seed, step, draw) alone, and draw 0 of a step is what a single draw per step gives."""
    rng = np.random.default_rng([seed, step] if draw == 0 else [seed, step, draw])
    if edge_share > 0 and rng.random() < edge_share:
        i, j = rng.choice(n_models, size=2, replace=False)
        lam = rng.random() if edge_lambda == "uniform" else float(np.clip(0.5 + 0.1 * rng.standard_normal(), 0, 1))
        alpha = np.zeros(n_models)
        alpha[i], alpha[j] = lam, 1.0 - lam
        return [float(a) for a in alpha]
    return [float(a) for a in rng.dirichlet(np.full(n_models, concentration))]


def latent_kind(element: Any, space: str) -> str:
    """The latent that refines a space the universe transform acted on with `element`."""
    if isinstance(element, Orthogonal):
        return "orthogonal"
    if isinstance(element, (Permutation, SemiPermutation)):
        return "permutation"
    raise ValueError(
        f"space {space}: cannot refine a {type(element).__name__} (orthogonal or permutation only): choose "
        "symmetry.residual=permutation for universe learning"
    )


def project(z: Tensor, kind: str) -> Tensor:
    """A latent's dense, differentiable element: polar factor or straight-through permutation."""
    return polar(z) if kind == "orthogonal" else straight_through_permutation(z)


def project_hard(z: Tensor, kind: str) -> Orthogonal | Permutation:
    z = z.detach().cpu().double()
    return Orthogonal.project(z) if kind == "orthogonal" else Permutation.project(z)


class UniverseLearningModule(DivergenceStop, L.LightningModule):
    """Latents for models 1..N-1 (`kinds[i - 1]`: space -> orthogonal | permutation), keyed
    "m<i>_<space>". Model 0 and the endpoints are plain attributes: outside the checkpoint and never
    broadcast by DDP; the checkpoint holds the latents, the optimizer and the history."""

    def __init__(
        self,
        models: list[CanonicalTransformer],
        kinds: list[dict[str, str]],
        settings: UniverseLearnedSettings,
        task: str,
        circuits: tuple[str, ...] = ("qk", "vo"),
    ):
        super().__init__()
        require_factored("learned universe refinement", *models)
        if len(kinds) != len(models) - 1:
            raise ValueError(f"{len(models)} models need {len(models) - 1} latent sets, got {len(kinds)}")
        self.config = models[0].config
        self.spec = SymmetrySpec.from_model(models[0])
        self.kinds = [dict(k) for k in kinds]
        self.settings = settings
        self.task = task
        self.circuits = tuple(circuits)
        self.n_models = len(models)
        self._endpoints = {i: {k: v.detach().clone() for k, v in m.params().items()} for i, m in enumerate(models)}
        generator = torch.Generator().manual_seed(settings.seed)
        self.latents = nn.ParameterDict()
        for i, model_kinds in enumerate(self.kinds, 1):
            for name in model_kinds:
                n = self.spec.spaces[name].size
                z = torch.eye(n) + settings.init_noise * torch.randn(n, n, generator=generator)
                self.latents[self.key(i, name)] = nn.Parameter(z)
        # per optimisation step: training loss and the merge coefficients
        self.register_buffer("history", torch.full((settings.max_steps, 1 + self.n_models), math.nan))

    @staticmethod
    def key(i: int, space: str) -> str:
        return f"m{i}_{latent_key(space)}"

    # the same lazy device move, optimizer, schedule and history resize as pairwise learned matching
    endpoint_params = LearnedMatchingModule.endpoint_params
    configure_optimizers = LearnedMatchingModule.configure_optimizers
    on_load_checkpoint = LearnedMatchingModule.on_load_checkpoint
    progress_name = LearnedMatchingModule.progress_name

    def matrices(self, i: int) -> dict[str, Tensor]:
        return {name: project(self.latents[self.key(i, name)], kind) for name, kind in self.kinds[i - 1].items()}

    def member_params(self) -> list[dict[str, Tensor]]:
        """[theta_0, T_1(theta_1), ..., T_{N-1}(theta_{N-1})] in factored form, inside the graph."""
        out = [self.endpoint_params(0)]
        for i in range(1, self.n_models):
            out.append(apply_dense(self.matrices(i), self.spec, self.endpoint_params(i)))
        return out

    def loss(self, inputs: Tensor, targets: Tensor, alpha: list[float]) -> Tensor:
        with full_precision(self.device):  # only the merged model's forward in half (mixed trainer.precision)
            params = merge_params(self.member_params(), alpha, self.circuits)
        total, _, count = loss_and_correct(canonical_forward(self.config, params, inputs), targets, self.task)
        return total / count

    def training_step(self, batch, batch_idx):
        s = self.settings
        # every rank draws the same candidates; with several, each keeps the worst on its own batch
        draws = [
            sample_alpha(self.n_models, s.concentration, s.seed, self.global_step, s.edge_share, s.edge_lambda, d)
            for d in range(s.candidates)
        ]
        alpha = draws[0]
        try:
            if len(draws) > 1:
                with torch.no_grad(), full_precision(self.device):
                    members = self.member_params()
                alpha = draws[worst_draw(self.config, self.task, self.circuits, members, *batch, draws)]
            loss = self.loss(*batch, alpha)
        except torch.linalg.LinAlgError as err:
            self.projection_failed(err, alpha)
            return None
        self.log("universe_loss", loss, prog_bar=True)
        if self.global_step < len(self.history):
            self.history[self.global_step] = torch.cat([loss.detach().view(1), loss.new_tensor(alpha)])
        return loss

    @torch.no_grad()
    def hard_transforms(self) -> list[Transform]:
        """Per model 1..N-1: Hungarian for permutation latents, U V^T for orthogonal ones."""
        return [
            Transform({name: project_hard(self.latents[self.key(i, name)], kind) for name, kind in kinds.items()})
            for i, kinds in enumerate(self.kinds, 1)
        ]


def learned_universe(
    aligned: UniverseAlignment,
    context: MatchContext,
    settings: UniverseLearnedSettings | None = None,
    name: str = "learned",
    **overrides: Any,
) -> UniverseAlignment:
    """Refine a universe alignment by training the symmetries of models 1..N-1 on the merged loss
    (`settings` or keyword settings, not both); transforms[i] is (universe transform, refinement)."""
    if settings is None:
        settings = UniverseLearnedSettings(**{"where": f"universe.{name}", **overrides})
    elif overrides:
        raise ValueError(f"pass settings or keyword settings, not both: {sorted(overrides)}")
    models = list(aligned.models)
    if len(models) < 2:
        raise ValueError(f"the learned refinement needs at least two models, got {len(models)}")
    require_factored(f"{name} universe refinement", *models)
    if len(aligned.transforms) != len(models):
        raise ValueError(f"{len(models)} models but {len(aligned.transforms)} transforms")
    spec = SymmetrySpec.from_model(models[0])
    kinds = _latent_kinds(aligned.transforms, spec)
    circuits = tuple(aligned.circuits)
    module = UniverseLearningModule(models, kinds, settings, models[0].task, circuits)

    key = settings_hash({"kinds": kinds, "circuits": circuits, **dataclasses.asdict(settings)}, *models)
    run_dir = context.run_dir / f"universe_{key}"
    last = run_dir / "checkpoints" / "last.ckpt"
    context.train_batches(f"{name} universe refinement")  # fails early without data
    logger = context.logger(f"{name}_universe") if context.logger else False
    fit = context.require("fit", f"{name} universe refinement")
    seconds, world_size, resume, earlier = fit(module, context, run_dir, settings, logger)
    module = module.cpu()

    start = [Transform(), *(Transform({n: Permutation.identity(spec.spaces[n].size) for n in k}) for k in kinds)]
    refinements, flags = _refinements(module, start, settings)
    refined = [models[0]] + [apply(t, m) for t, m in zip(refinements[1:], models[1:])]
    history = module.history[~module.history[:, 1].isnan()]  # the steps that ran
    diagnostics: dict[str, Any] = {
        **flags,
        "steps": len(history),
        "seconds": seconds,
        "seconds_before_resume": earlier,  # fit time of the interrupted attempts
        "history": finite_list(history[:, 0]),
        "alpha_history": [[float(a) for a in row] for row in history[:, 1:]],
        "concentration": settings.concentration,
        "edge_share": settings.edge_share,
        "edge_lambda": settings.edge_lambda,
        "changed_from_universe": [changes_from(s, t) for s, t in zip(start, refinements)],
        "world_size": world_size,
        "resumed_from": str(resume) if resume else None,
        "checkpoint": str(last),
        "universe": dict(aligned.diagnostics),
    }
    return UniverseAlignment(
        models=refined,
        transforms=list(zip(aligned.transforms, refinements)),
        circuits=circuits,
        diagnostics=diagnostics,
        function_preserving=aligned.function_preserving,
        anchor=interpolate(refined, [1.0 / len(refined)] * len(refined), circuits=()),
    )


def _latent_kinds(transforms: list, spec: SymmetrySpec) -> list[dict[str, str]]:
    """Per model 1..N-1, the latent kind of each space its universe transform acts on (checked to be a
    Transform over the model's spaces)."""
    kinds = []
    for i, transform in enumerate(transforms[1:], 1):
        if not isinstance(transform, dict):
            raise ValueError(f"model {i}: the universe transform is {type(transform).__name__}, not a Transform")
        missing = set(transform) - set(spec.spaces)
        if missing:
            raise ValueError(f"model {i}: the universe transform names spaces the model lacks: {sorted(missing)}")
        # unit scales have no latent: they stay as the universe alignment set them (the models carry them)
        kinds.append({space: latent_kind(g, space) for space, g in transform.items() if not isinstance(g, Diagonal)})
    return kinds


def _refinements(
    module: UniverseLearningModule, start: list[Transform], settings: UniverseLearnedSettings
) -> tuple[list[Transform], dict[str, Any]]:
    """The trained refinements' hard projections, or `start` with a warning and flags saying so where
    training diverged."""
    diverged = module.divergence()
    if diverged is None:
        return [Transform(), *module.hard_transforms()], {}
    # the universe alignment itself, as the refinement started there
    step, what = diverged
    log.warning(
        f"{settings.where} diverged at step {step} (lr={settings.lr:g}; {what}): kept the universe "
        f"alignment; lower {settings.where}.lr"
    )
    return start, {"diverged": True, "diverged_at": step, "divergence": what, "kept_start": True}
