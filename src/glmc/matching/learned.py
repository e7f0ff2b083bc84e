"""Learned matching (paper 001 §4.2): train the symmetry transformations on the task loss of the path.

  learned           orthogonal residual (polar factor) + head and MLP permutations (straight-through)
  learned_perm      every space permuted, the residual too (straight-through)
  learned_sinkhorn  orthogonal residual + soft head and MLP permutations (Sinkhorn, Appendix D)

The latents start at weight matching's solution (init="weight") or the identity and train through
`context.fit`, checkpointed under <run_dir>/pair_<hash> (the hash covers endpoints and settings, so a
rerun resumes). The hard projection is returned unless its path is worse than the start's on held-out
batches, or training diverged (`kept_start`, `diverged`); the Sinkhorn matcher returns the soft-aligned B
(not function-preserving) with the hard projection as a variant. Spaces no latent learns (Llama's
qheads, qk, vo, mlp_scale) take weight matching's elements, applied to B first and carried along by the
learned permutations; those of a task head's hidden state and of the spaces block kinds keep
(BlockKind.kept_spaces) are applied to B first and kept.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from glmc.alignment import Alignment
from glmc.matching.base import MatchContext, Matcher, circuit_pairs, require_factored, settings_hash
from glmc.matching.engine.residual_map import eigen_angles
from glmc.matching.learned_module import LearnedMatchingModule, LearnedSettings
from glmc.matching.weight import used_tokens, weight_matching
from glmc.models.canonical import CanonicalTransformer, relative_deviation
from glmc.models.families import family_named
from glmc.models.families.roles import HEAD_HIDDEN
from glmc.ranges import check_settings
from glmc.settings.methods import LearnedMatcherConfig
from glmc.symmetry import Orthogonal, Permutation, SymmetrySpec, Transform, apply, apply_dense
from glmc.symmetry.family_defaults import resolve_residual
from glmc.symmetry.groups import Element, SignedPermutation

log = logging.getLogger(__name__)


def as_dense(g) -> Tensor:
    """The element as a matrix: an orthogonal map's own, a permutation's dense form."""
    return g.matrix if isinstance(g, Orthogonal) else g.dense()


def unsigned(transform: Transform) -> Transform:
    """The transform with a signed residual permutation's order only: where the residual latent starts (its
    signs are applied to B first: residual_flips)."""
    g = transform.get("residual")
    return (
        transform if not isinstance(g, SignedPermutation) else Transform({**transform, "residual": Permutation(g.perm)})
    )


def residual_flips(transform: Transform) -> Transform:
    """A signed residual permutation's signs, indexed by B's own coordinates (applied to B before its order),
    or nothing."""
    g = transform.get("residual")
    if not isinstance(g, SignedPermutation):
        return Transform()
    flips = torch.empty_like(g.signs)
    flips[g.perm] = g.signs
    return Transform({"residual": SignedPermutation(torch.arange(g.size, device=g.perm.device), flips)})


def signed(learned: Transform, fixed: Transform) -> Transform:
    """The learned residual permutation with the signs applied to B first, as one signed permutation."""
    flips, g = fixed.get("residual"), learned.get("residual")
    if not isinstance(flips, SignedPermutation) or g is None:
        return learned
    return Transform({**learned, "residual": SignedPermutation(g.perm, flips.signs.to(g.perm.device)[g.perm])})


# the residual classes weight matching starts learned matching from, and the latent of each that has another
WEIGHT_RESIDUAL = ("orthogonal", "signed_permutation", "permutation")
LATENT_OF = {"signed_permutation": "permutation"}

# per-group and per-unit spaces that no latent learns, and the learned space that orders their elements
CARRIED = {"qheads": "heads", "qk": "heads", "vo": "heads", "mlp_scale": "mlp"}


def kept_spaces(model: CanonicalTransformer) -> tuple[str, ...]:
    """The space kinds no latent learns whose elements act on axes no latent moves, kept as weight matching
    found them: a task head's hidden state's, and those the model's block kinds keep."""
    kinds = family_named(model.config.family).kinds(model.config.form)
    return (HEAD_HIDDEN, *(space for kind in kinds for space in kind.kept_spaces))


def kept(transform: Transform, learned: dict, spaces: tuple[str, ...]) -> Transform:
    """The elements of `transform` in the kept `spaces` (kept_spaces) that have no latent in `learned`."""
    return Transform({n: g for n, g in transform.items() if n.partition(".")[0] in spaces and n not in learned})


def _rows(g: Element, index: Tensor) -> Element:
    """The element with its per-group (or per-unit) entries taken in `index` order."""
    fields = {f.name: getattr(g, f.name)[index.to(getattr(g, f.name).device)] for f in dataclasses.fields(g)}
    return dataclasses.replace(g, **fields)


def carried_along(transform: Transform, order: Transform, inverse: bool = False) -> Transform:
    """The elements of `transform`'s carried spaces (CARRIED) re-indexed by the permutations P in `order`:
    inverse=True from the order after P to B's own groups (to apply to B before P), False back."""
    out = Transform()
    for name, g in transform.items():
        kind, _, layer = name.partition(".")
        if kind not in CARRIED:
            continue
        perm = order.get(f"{CARRIED[kind]}.{layer}")
        if perm is None:
            out[name] = g
        else:
            out[name] = _rows(g, perm.perm.argsort() if inverse else perm.perm)
    return out


@dataclasses.dataclass
class Begun:
    """Where training starts: the start transform, weight matching's diagnostics, the elements applied to
    B first (spaces no latent learns) and B with them applied, and the seconds this took."""

    start: Transform
    wm: dict
    fixed: Transform
    b_fixed: CanonicalTransformer
    seconds: float


@dataclasses.dataclass
class _Fitted:
    """What context.fit reports: training seconds, world size, the checkpoint resumed (if any), the fit
    time of interrupted attempts; and the pair's last checkpoint."""

    seconds: float
    world_size: int
    resume: Any
    earlier: Any
    last: Path


class LearnedMatcher(Matcher):
    """Latents per space kind: residual orthogonal | permutation | none; heads and MLP `units`
    (permutation: straight-through Hungarian; sinkhorn: soft) unless they are "none"."""

    def __init__(
        self,
        name: str = "learned",
        residual: str = "auto",
        heads: str = "permutation",
        mlp: str = "permutation",
        units: str = "permutation",
        qk: str = "circuit",
        vo: str = "circuit",
        init: str = "weight",
        weight_max_iter: int = 15,
        weight_tol: float = 1e-6,
        **settings,
    ):
        check_settings(LearnedMatcherConfig, f"matcher.{name}", locals())  # the training settings: LearnedSettings
        self.name, self.init, self.circuits, self.residual = name, init, circuit_pairs(qk, vo), str(residual)
        self.kinds = {
            "residual": str(residual),
            "heads": units if heads != "none" else "none",
            "mlp": units if mlp != "none" else "none",
        }
        self.weight_max_iter, self.weight_tol = weight_max_iter, weight_tol
        self.settings = LearnedSettings(**settings, where=f"matcher.{name}")

    def initial_transform(
        self, a: CanonicalTransformer, b: CanonicalTransformer, spec: SymmetrySpec, tokens: Tensor | None = None
    ):
        spaces = [s for s in spec if self.kinds.get(s.kind, "none") != "none"]
        if self.init == "identity":
            return Transform({s.name: Permutation.identity(s.size) for s in spaces}), {}
        residual = self.kinds["residual"] if self.kinds["residual"] in WEIGHT_RESIDUAL else "none"
        heads, mlp = self.kinds["heads"] != "none", self.kinds["mlp"] != "none"
        transform, diagnostics = weight_matching(
            a, b, residual, heads, mlp, self.weight_max_iter, self.weight_tol, tokens=tokens
        )
        return transform, {"iterations": diagnostics["iterations"], "final_distance": diagnostics["final_distance"]}

    def checkpoint_key(self, a: CanonicalTransformer, b: CanonicalTransformer) -> str:
        settings = {
            "kinds": self.kinds,
            "init": self.init,
            "circuits": self.circuits,
            "weight": [self.weight_max_iter, self.weight_tol],
            **{k: v for k, v in dataclasses.asdict(self.settings).items() if k not in UNHASHED},
        }
        return settings_hash(settings, a, b)

    def match(self, a: CanonicalTransformer, b: CanonicalTransformer, context: MatchContext) -> Alignment:
        require_factored(self.name, a, b)
        # auto: the family's widest class, chosen again for every pair (a matcher may serve several families)
        self.kinds["residual"] = resolve_residual(self.residual, family_named(a.config.family))[0]
        loader = context.train_batches(self.name)
        spec = SymmetrySpec.from_model(b)
        # a signed residual permutation learns its order; its signs are weight matching's (residual_flips)
        latent = {**self.kinds, "residual": LATENT_OF.get(self.kinds["residual"], self.kinds["residual"])}
        kinds = {s.name: latent[s.kind] for s in spec if latent.get(s.kind, "none") != "none"}
        begun = self.begin(a, b, spec, kinds, context)
        module = self.build_module(a, begun, kinds, b.task)
        run = self.fit(module, a, b, context)
        module = module.cpu()
        diverged = module.divergence()
        if diverged is not None:
            ran = module.history[~module.history[:, 1].isnan()]  # a diverged step's loss may be NaN
            diagnostics = self.run_diagnostics(begun, run, ran, finite_list, {})
            return self.keep_start(a, b, begun.start, next(iter(loader))[0], diverged, diagnostics)

        learned = signed(module.hard_transform(), begun.fixed)
        held = kept(begun.fixed, learned, kept_spaces(b))
        hard = Transform({**learned, **carried_along(begun.fixed, learned), **held})
        aligned = apply(hard, b)
        inputs = next(iter(loader))[0]
        with torch.no_grad():
            logits_b = b(inputs)
            deviation = relative_deviation(aligned(inputs), logits_b)
        history = module.history[~module.history[:, 0].isnan()]
        outcome = {
            "changed_from_init": changes_from(begun.start, learned),
            "endpoint_deviation": deviation,  # on one training batch; the pipeline reports the test split's
        }
        diagnostics = self.run_diagnostics(begun, run, history, lambda t: [float(x) for x in t], outcome)
        if self.init == "weight" and self.kinds["residual"] == "orthogonal":
            # paper 001 Fig. 5: the angles of the correction O_learned O_wm^T (even where the start is kept)
            start = begun.start
            correction = as_dense(hard["residual"]).cpu().double() @ as_dense(start["residual"]).cpu().double().T
            diagnostics["correction_angles"] = eigen_angles(correction)
        reference = self.reference(module, a, inputs, diagnostics)
        hard_alignment = Alignment(reference=reference, model=aligned, transform=hard, circuits=self.circuits)
        if "sinkhorn" not in kinds.values():
            return self.guarded(a, b, begun.start, hard_alignment, diagnostics, context)
        soft_b, diagnostics["endpoint_deviation"] = soft_model(b, begun.b_fixed, module, spec, inputs, logits_b)
        variants = {"hard_projection": hard_alignment}
        return Alignment(a, soft_b, hard, self.circuits, diagnostics, function_preserving=False, variants=variants)

    def build_module(self, a: CanonicalTransformer, begun: Begun, kinds: dict, task: str) -> LearnedMatchingModule:
        """The LightningModule whose latents learn B's transform, from the start."""
        init = {n: as_dense(unsigned(begun.start)[n]) for n in kinds}
        return LearnedMatchingModule(a, begun.b_fixed, init, kinds, self.settings, task, self.circuits)

    def reference(
        self, module: LearnedMatchingModule, a: CanonicalTransformer, inputs: Tensor, diagnostics: dict
    ) -> CanonicalTransformer:
        """The path's other end after training: A itself (learned_dual transforms it too)."""
        return a

    def begin(
        self, a: CanonicalTransformer, b: CanonicalTransformer, spec: SymmetrySpec, kinds: dict, context: MatchContext
    ) -> Begun:
        """The start (weight matching or the identity) and B with the elements no latent learns applied."""
        tick = time.perf_counter()
        start, wm = self.initial_transform(a, b, spec, used_tokens(b, context))
        # spaces without latents (grouped rotary models; a post-LN head's own hidden state): weight
        # matching's elements, applied to B first
        fixed = carried_along(start, start, inverse=True)
        fixed.update(kept(start, kinds, kept_spaces(b)))
        fixed.update(residual_flips(start))
        b_fixed = apply(fixed, b) if fixed else b
        return Begun(start, wm, fixed, b_fixed, time.perf_counter() - tick)

    def fit(
        self, module: LearnedMatchingModule, a: CanonicalTransformer, b: CanonicalTransformer, context: MatchContext
    ) -> _Fitted:
        """Trains the latents through context.fit, resuming this pair's checkpoint where there is one."""
        pair_dir = context.run_dir / f"pair_{self.checkpoint_key(a, b)}"
        last = pair_dir / "checkpoints" / "last.ckpt"
        logger = context.logger(self.name) if context.logger else False
        fit = context.require("fit", self.name)
        seconds_train, world_size, resume, earlier = fit(module, context, pair_dir, self.settings, logger)
        return _Fitted(seconds_train, world_size, resume, earlier, last)

    def run_diagnostics(
        self, begun: Begun, run: _Fitted, history: Tensor, floats: Callable[[Tensor], list], outcome: dict
    ) -> dict[str, Any]:
        """What the run did: its start, steps, loss and lambda per step (as `floats` writes them), the
        `outcome` entries and its seconds."""
        return {
            "init": self.init,
            "weight_matching": begun.wm,
            "steps": len(history),
            "world_size": run.world_size,
            "resumed_from": str(run.resume) if run.resume else None,
            "checkpoint": str(run.last),
            "loss_history": floats(history[:, 0]),
            "lambda_history": floats(history[:, 1]),
            **outcome,
            "seconds_init": begun.seconds,
            "seconds_train": run.seconds,
            "seconds_before_resume": run.earlier,  # fit time of the interrupted attempts
        }

    def guarded(
        self,
        a: CanonicalTransformer,
        b: CanonicalTransformer,
        start: Transform,
        learned: Alignment,
        diagnostics: dict[str, Any],
        context: MatchContext,
    ) -> Alignment:
        """Never worse than the start: both paths compared on held-out batches, the better one returned
        with `diagnostics` and the comparison."""
        path_loss, held_out = context.require("path_loss", self.name), context.validation_batches(self.name)
        start_alignment = Alignment(reference=a, model=apply(start, b), transform=start, circuits=self.circuits)
        paths = {"start": start_alignment, "learned": learned}
        losses = path_loss(paths, GUARD_LAMBDAS, held_out, b.task, context.device)
        worst = {name: max(loss) for name, loss in losses.items()}
        diagnostics["validation_path_max_loss"] = worst
        diagnostics["kept_start"] = worst["learned"] > worst["start"]
        chosen = start_alignment if diagnostics["kept_start"] else learned
        chosen.diagnostics = diagnostics
        return chosen

    def keep_start(
        self, a, b, start: Transform, inputs: Tensor, diverged: tuple[int, str], diagnostics: dict[str, Any]
    ) -> Alignment:
        """The start's alignment after training diverged, with a warning that says what to change."""
        step, what = diverged
        where, lr = self.settings.where, self.settings.lr
        begin = "weight-matching" if self.init == "weight" else "identity"
        log.warning(f"{where} diverged at step {step} (lr={lr:g}; {what}): kept the {begin} start; lower {where}.lr")
        aligned = apply(start, b)
        with torch.no_grad():
            deviation = relative_deviation(aligned(inputs), b(inputs))
        diagnostics = {
            **diagnostics,
            "diverged": True,
            "diverged_at": step,
            "divergence": what,
            "endpoint_deviation": deviation,
            "kept_start": True,
        }
        return Alignment(reference=a, model=aligned, transform=start, circuits=self.circuits, diagnostics=diagnostics)


def soft_model(
    b: CanonicalTransformer,
    b_fixed: CanonicalTransformer,
    module: LearnedMatchingModule,
    spec: SymmetrySpec,
    inputs: Tensor,
    logits_b: Tensor,
) -> tuple[CanonicalTransformer, float]:
    """The Sinkhorn matcher's soft-aligned B (the path it trained: its soft matrices applied to b_fixed),
    and its deviation from B's logits on `inputs`."""
    with torch.no_grad():
        soft = {n: m.double() for n, m in module.matrices().items()}
        params = apply_dense(soft, spec, {k: v.double() for k, v in b_fixed.params().items()})
        soft_b = CanonicalTransformer(dataclasses.replace(b.config), {k: v.float() for k, v in params.items()})
        return soft_b, relative_deviation(soft_b(inputs), logits_b)


def finite_list(values: Tensor) -> list[float | None]:
    """Floats, with None for NaN and infinities (diagnostics are written as strict JSON)."""
    return [float(x) if math.isfinite(x) else None for x in values.tolist()]


GUARD_LAMBDAS = (0.25, 0.5, 0.75)  # interior points: the endpoints are the same for both paths
# settings that only log, or choose where the same optimum is computed: a run that differs in them alone
# resumes the same checkpoint
UNHASHED = ("epoch_test_batches", "assignment")


def changes_from(start: Transform, final: Transform) -> dict[str, float]:
    """Per space: share of units assigned differently (permutations), or ||O - O_0|| / sqrt(n)."""
    out = {}
    for name, g in final.items():
        g0 = start[name]
        if isinstance(g, (Permutation, SignedPermutation)):
            p0 = g0.perm if isinstance(g0, (Permutation, SignedPermutation)) else Permutation.project(as_dense(g0)).perm
            out[name] = float((g.perm.cpu() != p0.cpu()).float().mean())
        else:
            d = (g.matrix.double() - as_dense(g0).double().to(g.matrix.device)).norm() / g.matrix.shape[1] ** 0.5
            out[name] = float(d)
    return out
