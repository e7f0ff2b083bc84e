"""Learned matching (paper 001 §4.2): train the symmetry transformations on the task loss of the path.

  learned           orthogonal residual (polar factor) + head and MLP permutations (straight-through)
  learned_perm      every space permuted, the residual too (straight-through)
  learned_sinkhorn  orthogonal residual + soft head and MLP permutations (Sinkhorn, Appendix D)

The latents start at the weight-matching solution (init="weight") or the identity. Training runs
through `context.fit` (glmc.train.latent_fit.fit_latents) with the same Lightning Trainer settings as
the endpoints, with checkpoints under <context.run_dir>/pair_<hash>/checkpoints, the hash covering
the endpoints and every setting: a run started again with the same endpoints and settings resumes
from last.ckpt, any other starts afresh. The returned transform is the hard projection of the
latents, so the aligned model B computes B's function, unless its path is worse than the start's on
held-out batches (the validation split, or training batches where the dataset has none; measured by
`context.path_loss`, the evaluator's): then the start is returned (`kept_start`). A run whose loss
or latents stop being finite stops at that step and returns the start too, with `diverged` in its
diagnostics and a warning naming the lr (glmc.matching.learned_module.DivergenceStop).
The Sinkhorn matcher returns the soft-aligned B instead (the path it trained), marked as not
function-preserving, with the hard projection as a variant path.

Grouped-query rotary models (Llama) have spaces that no latent learns: the query heads within each
key/value group (qheads), the rotary rotation-scalings (qk), the per-group value maps (vo) and the
gated MLP's up/down scales (mlp_scale). They are taken from the weight-matching start and applied to
B before training, each moved to the group or unit of B it belongs to (weight matching indexes them by
the groups and units after its permutations), so that the learned key/value group and MLP
permutations carry them along; the returned transform composes both and acts on B itself. With
init=identity these spaces stay as they are. With qk and vo interpolated as circuits (rotary heads
stacked, glmc.interpolation) the path does not depend on them.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import Any

import torch
from torch import Tensor

from glmc.alignment import Alignment
from glmc.matching.base import MatchContext, circuit_pairs, require_factored, settings_hash
from glmc.matching.learned_module import LearnedMatchingModule, LearnedSettings
from glmc.matching.weight import eigen_angles, used_tokens, weight_matching
from glmc.models.canonical import CanonicalTransformer, relative_deviation
from glmc.models.families.roles import HEAD_HIDDEN
from glmc.symmetry import Orthogonal, Permutation, SymmetrySpec, Transform, apply, apply_dense
from glmc.symmetry.groups import Element

log = logging.getLogger(__name__)


def _dense(g) -> Tensor:
    return g.matrix if isinstance(g, Orthogonal) else g.dense()


# per-group and per-unit spaces that no latent learns, and the learned space that orders their elements
CARRIED = {"qheads": "heads", "qk": "heads", "vo": "heads", "mlp_scale": "mlp"}


def _rows(g: Element, index: Tensor) -> Element:
    """The element with its per-group (or per-unit) entries taken in `index` order."""
    fields = {f.name: getattr(g, f.name)[index.to(getattr(g, f.name).device)] for f in dataclasses.fields(g)}
    return dataclasses.replace(g, **fields)


def carried_along(transform: Transform, order: Transform, inverse: bool = False) -> Transform:
    """The elements of `transform`'s carried spaces (CARRIED) re-indexed by the permutations in `order`.

    Elements of a transform are indexed by the groups (units) after its permutation P: entry i belongs
    to B's group P[i]. inverse=True gives entry j to B's own group j (the elements to apply to B before
    P); inverse=False takes elements indexed by B's own groups to the order after P."""
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


class LearnedMatcher:
    """Latents per space kind: residual orthogonal | permutation | none; heads and MLP `units`
    (permutation: straight-through Hungarian; sinkhorn: soft) unless they are "none"."""

    def __init__(
        self,
        name: str = "learned",
        residual: str = "orthogonal",
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
        if init not in ("weight", "identity"):
            raise ValueError(f"matcher.{name}.init={init!r} is not one of weight, identity")
        if units not in ("permutation", "sinkhorn"):
            raise ValueError(f"matcher.{name}.units={units!r} is not one of permutation, sinkhorn")
        self.name, self.init, self.circuits = name, init, circuit_pairs(qk, vo)
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
        residual = {"orthogonal": "orthogonal", "permutation": "permutation"}.get(self.kinds["residual"], "none")
        transform, diagnostics = weight_matching(
            a,
            b,
            residual=residual,
            heads=self.kinds["heads"] != "none",
            mlp=self.kinds["mlp"] != "none",
            max_iter=self.weight_max_iter,
            tol=self.weight_tol,
            tokens=tokens,
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
        loader = context.train_batches(self.name)
        spec = SymmetrySpec.from_model(b)
        kinds = {s.name: self.kinds[s.kind] for s in spec if self.kinds.get(s.kind, "none") != "none"}

        tick = time.perf_counter()
        start, wm = self.initial_transform(a, b, spec, used_tokens(b, context))
        # spaces without latents (grouped rotary models; a post-LN head's own hidden state): weight
        # matching's elements, applied to B first
        fixed = carried_along(start, start, inverse=True)
        fixed.update({n: g for n, g in start.items() if n == HEAD_HIDDEN and n not in kinds})
        b_fixed = apply(fixed, b) if fixed else b
        seconds_init = time.perf_counter() - tick
        module = LearnedMatchingModule(
            a, b_fixed, {n: _dense(start[n]) for n in kinds}, kinds, self.settings, b.task, self.circuits
        )

        pair_dir = context.run_dir / f"pair_{self.checkpoint_key(a, b)}"
        last = pair_dir / "checkpoints" / "last.ckpt"
        logger = context.logger(self.name) if context.logger else False
        fit = context.require("fit", self.name)
        seconds_train, world_size, resume, earlier = fit(module, context, pair_dir, self.settings, logger)
        module = module.cpu()
        diverged = module.divergence()
        if diverged is not None:
            ran = module.history[~module.history[:, 1].isnan()]  # a diverged step's loss may be NaN
            diagnostics = {
                "init": self.init,
                "weight_matching": wm,
                "steps": len(ran),
                "world_size": world_size,
                "resumed_from": str(resume) if resume else None,
                "checkpoint": str(last),
                "loss_history": finite_list(ran[:, 0]),
                "lambda_history": finite_list(ran[:, 1]),
                "seconds_init": seconds_init,
                "seconds_train": seconds_train,
                "seconds_before_resume": earlier,
            }
            return self.keep_start(a, b, start, next(iter(loader))[0], diverged, diagnostics)

        learned = module.hard_transform()
        kept = {n: g for n, g in fixed.items() if n == HEAD_HIDDEN}  # acts on axes no latent moves
        hard = Transform({**learned, **carried_along(fixed, learned), **kept})  # acts on B itself
        aligned = apply(hard, b)
        inputs = next(iter(loader))[0]
        with torch.no_grad():
            logits_b = b(inputs)
            deviation = relative_deviation(aligned(inputs), logits_b)
        history = module.history[~module.history[:, 0].isnan()]
        diagnostics: dict[str, Any] = {
            "init": self.init,
            "weight_matching": wm,
            "steps": len(history),
            "world_size": world_size,
            "resumed_from": str(resume) if resume else None,
            "checkpoint": str(last),
            "loss_history": [float(x) for x in history[:, 0]],
            "lambda_history": [float(x) for x in history[:, 1]],
            "changed_from_init": _changes(start, learned),
            "endpoint_deviation": deviation,  # on one training batch; the pipeline reports the test split's
            "seconds_init": seconds_init,
            "seconds_train": seconds_train,
            "seconds_before_resume": earlier,  # fit time of the interrupted attempts
        }
        if self.init == "weight" and self.kinds["residual"] == "orthogonal":
            # paper 001 Fig. 5: what training changed in weight matching's residual map, as the angles of
            # the correction O_learned O_wm^T (of the trained latents, also where kept_start returns the start)
            correction = _dense(hard["residual"]).cpu().double() @ _dense(start["residual"]).cpu().double().T
            diagnostics["correction_angles"] = eigen_angles(correction)
        hard_alignment = Alignment(reference=a, model=aligned, transform=hard, circuits=self.circuits)
        if "sinkhorn" not in kinds.values():
            # never worse than the start: compare both paths on held-out batches, keep the better
            path_loss, held_out = context.require("path_loss", self.name), context.validation_batches(self.name)
            start_alignment = Alignment(reference=a, model=apply(start, b), transform=start, circuits=self.circuits)
            paths = {"start": start_alignment, "learned": hard_alignment}
            losses = path_loss(paths, GUARD_LAMBDAS, held_out, b.task, context.device)
            worst = {name: max(loss) for name, loss in losses.items()}
            diagnostics["validation_path_max_loss"] = worst
            diagnostics["kept_start"] = worst["learned"] > worst["start"]
            chosen = start_alignment if diagnostics["kept_start"] else hard_alignment
            chosen.diagnostics = diagnostics
            return chosen
        with torch.no_grad():
            soft = {n: m.double() for n, m in module.matrices().items()}
            params = apply_dense(soft, spec, {k: v.double() for k, v in b_fixed.params().items()})
            soft_b = CanonicalTransformer(dataclasses.replace(b.config), {k: v.float() for k, v in params.items()})
            diagnostics["endpoint_deviation"] = relative_deviation(soft_b(inputs), logits_b)
        return Alignment(
            reference=a,
            model=soft_b,
            transform=hard,
            circuits=self.circuits,
            diagnostics=diagnostics,
            function_preserving=False,
            variants={"hard_projection": hard_alignment},
        )

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


def finite_list(values: Tensor) -> list[float | None]:
    """Floats, with None for NaN and infinities (diagnostics are written as strict JSON)."""
    return [float(x) if math.isfinite(x) else None for x in values.tolist()]


GUARD_LAMBDAS = (0.25, 0.5, 0.75)  # interior points: the endpoints are the same for both paths
# settings that only log: a run that differs in them alone resumes the same checkpoint
UNHASHED = ("epoch_test_batches",)


def _changes(start: Transform, final: Transform) -> dict[str, float]:
    """Per space: share of units assigned differently (permutations), or ||O - O_0|| / sqrt(n)."""
    out = {}
    for name, g in final.items():
        g0 = start[name]
        if isinstance(g, Permutation):
            p0 = g0.perm if isinstance(g0, Permutation) else Permutation.project(_dense(g0)).perm
            out[name] = float((g.perm.cpu() != p0.cpu()).float().mean())
        else:
            d = (g.matrix.double() - _dense(g0).double().to(g.matrix.device)).norm() / g.matrix.shape[1] ** 0.5
            out[name] = float(d)
    return out
