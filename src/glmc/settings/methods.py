"""Every alignment method's settings: one config dataclass per method (`matcher.<name>`), whose `_target_`
names the matcher class and whose other fields are its constructor's arguments with their ranges.
METHODS lists the pairwise methods (MatcherConfig is made from it), MULTI_METHODS the multi-model ones."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields, make_dataclass
from typing import Any

from glmc.choices import (
    ActivationResidual,
    HeadAssignment,
    HeadForm,
    LearnedInit,
    ResidualClass,
    ResidualMap,
    UnitClass,
    UnitLatent,
)
from glmc.ranges import setting
from glmc.settings.groups import LearnedTraining, UniverseTraining


@dataclass
class VanillaMatcherConfig:
    """Plain averaging of the original (HF) parameters."""

    _target_: str = "glmc.matching.vanilla.VanillaMatcher"
    name: str = "vanilla"


@dataclass
class CanonicalMatcherConfig:
    """The canonical form without alignment: what the reparameterisation alone does."""

    _target_: str = "glmc.matching.unaligned.CanonicalMatcher"
    name: str = "canonical"
    qk: HeadForm = "${symmetry.qk}"  # type: ignore[assignment]
    vo: HeadForm = "${symmetry.vo}"  # type: ignore[assignment]


@dataclass
class WeightMatcherConfig:
    """Paper 001 §4.1 weight matching."""

    _target_: str = "glmc.matching.weight.WeightMatcher"
    name: str = "weight"
    residual: ResidualClass = "${symmetry.residual}"  # type: ignore[assignment]
    heads: UnitClass = "${symmetry.heads}"  # type: ignore[assignment]
    mlp: UnitClass = "${symmetry.mlp}"  # type: ignore[assignment]
    qk: HeadForm = "${symmetry.qk}"  # type: ignore[assignment]
    vo: HeadForm = "${symmetry.vo}"  # type: ignore[assignment]
    max_iter: int = setting(15, "count")
    tol: float = setting(1e-6, "nonnegative")
    # language models: embedding rows of tokens in the training data (or "all")
    vocabulary: str = setting("train", choices=("train", "all"))
    # auto: the residual map fixes the all-ones vector of mean-zero streams (LayerNorm export); always: or an error
    keep_mean: str = setting("never", choices=("auto", "always", "never"))
    # where the search's products run: auto = where the models are (or trainer=gpu's device)
    device: str = setting("auto", choices=("auto", "cpu", "cuda"))
    # mixtures of experts: permutation reorders the experts (router rows with them), fixed keeps their order
    experts: str = setting("permutation", choices=("permutation", "fixed"))
    # plain ReLU-like MLPs: units compared up to their positive scale, which is then set (false: plain cosines)
    unit_scales: bool = setting(True, "flag")


@dataclass
class WeightRefinedMatcherConfig:
    """Weight matching, then its residual map refined without data (glmc.matching.weight_refined)."""

    _target_: str = "glmc.matching.weight_refined.WeightRefinedMatcher"
    name: str = "weight_refined"
    residual: ResidualClass = "${symmetry.residual}"  # type: ignore[assignment]
    heads: UnitClass = "${symmetry.heads}"  # type: ignore[assignment]
    mlp: UnitClass = "${symmetry.mlp}"  # type: ignore[assignment]
    qk: HeadForm = "${symmetry.qk}"  # type: ignore[assignment]
    vo: HeadForm = "${symmetry.vo}"  # type: ignore[assignment]
    max_iter: int = setting("${matcher.weight.max_iter}", "count")
    tol: float = setting("${matcher.weight.tol}", "nonnegative")
    vocabulary: str = setting("${matcher.weight.vocabulary}", choices=("train", "all"))
    # gain: the midpoint readers' loss of gain; stream: B's readers and writers against A's (docs/methods.md)
    proxy: str = setting("gain", choices=("gain", "stream"))
    proxy_weight: float = setting(0.1, "nonnegative")  # 0: weight matching's objective alone
    starts: int = setting(1, "count0")  # random orthogonal starts beside weight matching's and weight_perm's
    rounds: int = setting(4, "count")  # alternations of unit assignments and residual steps per start
    steps: int = setting(25, "count")  # Riemannian steps of the residual map per round
    seed: int = setting(0, "seed")  # the random starts


@dataclass
class LearnedMatcherConfig(LearnedTraining):
    """Paper 001 §4.2 learned matching: LearnedTraining's settings and which spaces are learned."""

    _target_: str = "glmc.matching.learned.LearnedMatcher"
    name: str = "learned"
    residual: ResidualClass = "${symmetry.residual}"  # type: ignore[assignment]
    heads: UnitClass = "${symmetry.heads}"  # type: ignore[assignment]
    mlp: UnitClass = "${symmetry.mlp}"  # type: ignore[assignment]
    units: UnitLatent = UnitLatent.permutation  # latents of heads and MLP: straight-through or Sinkhorn
    qk: HeadForm = "${symmetry.qk}"  # type: ignore[assignment]
    vo: HeadForm = "${symmetry.vo}"  # type: ignore[assignment]
    init: LearnedInit = LearnedInit.weight
    weight_max_iter: int = setting("${matcher.weight.max_iter}", "count")
    weight_tol: float = setting("${matcher.weight.tol}", "nonnegative")


@dataclass
class LearnedDualMatcherConfig(LearnedMatcherConfig):
    """Learned matching of both endpoints' transforms, with matcher.learned's settings."""

    _target_: str = "glmc.matching.learned_dual.LearnedDualMatcher"
    name: str = "learned_dual"


@dataclass
class ActivationMatcherConfig:
    """Paper 003 activation matching; attention weights interpolated factored, as in that paper."""

    _target_: str = "glmc.matching.activation.ActivationMatcher"
    name: str = "activation"
    residual: ActivationResidual = ActivationResidual.all
    residual_map: ResidualMap = ResidualMap.permutation
    heads: HeadAssignment = HeadAssignment.two_stage
    mlp: UnitClass = UnitClass.permutation
    qk: HeadForm = HeadForm.none
    vo: HeadForm = HeadForm.none
    batches: int = setting(16, "count")  # training batches whose activations are recorded


@dataclass
class RotationMatcherConfig:
    """Paper 002: closed-form per-head rotations of Q/K and V/O, MLP permutations; factored."""

    _target_: str = "glmc.matching.rotation.RotationMatcher"
    name: str = "rotation"
    residual: ResidualClass = ResidualClass.none
    heads: UnitClass = UnitClass.none  # paper 002 keeps heads in place
    mlp: UnitClass = UnitClass.permutation
    rescale: bool = setting(True, "flag")
    qk: HeadForm = HeadForm.none
    vo: HeadForm = HeadForm.none
    max_iter: int = setting("${matcher.weight.max_iter}", "count")
    tol: float = setting("${matcher.weight.tol}", "nonnegative")
    vocabulary: str = setting("${matcher.weight.vocabulary}", choices=("train", "all"))


@dataclass(frozen=True)
class Method:
    """A registered pairwise method: its config dataclass and the factory of its default node."""

    schema: type
    make: Callable[[], Any]


def _variant(base: str, cls: type, **own) -> Method:
    """A method that shares `matcher.<base>`'s settings (by interpolation) except `own`."""
    skip = {"_target_", "residual", "heads", "mlp", "units", "qk", "vo", *own}
    shared = {f.name: f"${{matcher.{base}.{f.name}}}" for f in fields(cls) if f.name not in skip}
    return Method(cls, lambda: cls(**shared, **own))


# name -> the method's config and defaults, registered here only; the order is the plot order
METHODS: dict[str, Method] = {
    "vanilla": Method(VanillaMatcherConfig, VanillaMatcherConfig),
    "canonical": Method(CanonicalMatcherConfig, CanonicalMatcherConfig),
    "weight_perm": _variant("weight", WeightMatcherConfig, name="weight_perm", residual=ResidualClass.permutation),
    "weight": Method(WeightMatcherConfig, WeightMatcherConfig),
    "weight_refined": Method(WeightRefinedMatcherConfig, WeightRefinedMatcherConfig),
    "activation": Method(ActivationMatcherConfig, ActivationMatcherConfig),
    "activation_orth": _variant(
        "activation", ActivationMatcherConfig, name="activation_orth", residual_map=ResidualMap.orthogonal
    ),
    "rotation": Method(RotationMatcherConfig, RotationMatcherConfig),
    "learned": Method(LearnedMatcherConfig, LearnedMatcherConfig),
    "learned_perm": _variant("learned", LearnedMatcherConfig, name="learned_perm", residual=ResidualClass.permutation),
    "learned_sinkhorn": _variant("learned", LearnedMatcherConfig, name="learned_sinkhorn", units=UnitLatent.sinkhorn),
    "learned_dual": _variant("learned", LearnedDualMatcherConfig, name="learned_dual"),
}

MatcherConfig = make_dataclass(
    "MatcherConfig",
    [
        ("name", str, field(default="compare")),
        ("methods", list[str], field(default_factory=lambda: ["vanilla"])),
        *((name, method.schema, field(default_factory=method.make)) for name, method in METHODS.items()),
    ],
    namespace={"__module__": __name__, "__doc__": "Which methods a run evaluates and every method's settings."},
)


@dataclass(frozen=True)
class MultiMethod:
    """A multi-model method (`multi.methods`): how the endpoints are aligned before their simplex is evaluated."""

    universe: bool  # aligned to a shared universe by the pairwise method `multi.pairwise`; else as trained
    # then refine(universe_alignment, context, where="multi", **settings read from `multi.*`), a dotted path
    refine: str | None = None
    settings: type | None = None


# name -> how that multi-model method aligns; the order is the default `multi.methods`.
MULTI_METHODS: dict[str, MultiMethod] = {
    "vanilla": MultiMethod(universe=False),  # the original parameters, averaged
    "weight": MultiMethod(universe=True),
    "learned": MultiMethod(
        universe=True, refine="glmc.matching.universe_learned.learned_universe", settings=UniverseTraining
    ),
}


def default_target(name: str) -> str:
    """The class registered method `name` builds."""
    return next(f.default for f in fields(METHODS[name].schema) if f.name == "_target_")
