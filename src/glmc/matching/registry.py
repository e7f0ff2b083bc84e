"""The one registry of alignment methods: a structured config per method, built by `instantiate`.

Each entry is a dataclass whose `_target_` names the matcher class and whose other fields are that
class's constructor arguments. `run.py` composes them under `matcher.<name>` (so every option is
type-checked at composition and overridable, e.g. `matcher.weight.max_iter=5`), and `glmc.align`
builds the same nodes from Python. Symmetry classes default to the run's `symmetry` group by
interpolation; outside Hydra they resolve against the schema's defaults.

This module imports no matcher: the classes are loaded by `instantiate` when a method is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from omegaconf import DictConfig, OmegaConf

from glmc.choices import (
    ActivationResidual,
    HeadAssignment,
    HeadForm,
    LambdaScheme,
    LearnedInit,
    ResidualClass,
    ResidualMap,
    UnitClass,
    UnitLatent,
)


@dataclass
class VanillaMatcherConfig:
    """Plain averaging of the original (HF) parameters."""

    _target_: str = "glmc.matching.vanilla.VanillaMatcher"
    name: str = "vanilla"


@dataclass
class CanonicalMatcherConfig:
    """The canonical form without alignment: what the reparameterisation alone does."""

    _target_: str = "glmc.matching.canonical.CanonicalMatcher"
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
    max_iter: int = 15
    tol: float = 1e-6
    vocabulary: str = "train"  # language models: embedding rows of tokens in the training data (or "all")
    # auto: the orthogonal residual map fixes the all-ones vector when both streams are mean-zero, so merges
    # export to HF LayerNorm models; never (default): unrestricted Procrustes; always: restricted or an error
    keep_mean: str = "never"


@dataclass
class LearnedMatcherConfig:
    """Paper 001 §4.2 learned matching. Defaults as the width-64 digits ablations (Figs. 8 and 9)
    use them; the demo's config sets 600 steps at lr 0.01 (README, "Choosing the demo model"); paper
    001 trains CIFAR-10 with lr 3e-4 and lambda_scheme uniform_mid for 5 epochs."""

    _target_: str = "glmc.matching.learned.LearnedMatcher"
    name: str = "learned"
    residual: ResidualClass = "${symmetry.residual}"  # type: ignore[assignment]
    heads: UnitClass = "${symmetry.heads}"  # type: ignore[assignment]
    mlp: UnitClass = "${symmetry.mlp}"  # type: ignore[assignment]
    units: UnitLatent = UnitLatent.permutation  # latents of heads and MLP: straight-through or Sinkhorn
    qk: HeadForm = "${symmetry.qk}"  # type: ignore[assignment]
    vo: HeadForm = "${symmetry.vo}"  # type: ignore[assignment]
    init: LearnedInit = LearnedInit.weight
    weight_max_iter: int = "${matcher.weight.max_iter}"  # type: ignore[assignment]
    weight_tol: float = "${matcher.weight.tol}"  # type: ignore[assignment]
    max_steps: int = 1500
    lr: float = 0.3
    weight_decay: float = 0.01
    warmup_fraction: float = 0.05
    lambda_scheme: LambdaScheme = LambdaScheme.gaussian
    # draws of lambda per step; >1 trains at the draw whose batch loss exceeds the endpoints' line the most
    lambda_candidates: int = 1
    init_noise: float = 1e-3  # std of the Gaussian added to the initial latents
    sinkhorn_iters: int = 20
    sinkhorn_temperature: float = 1.0
    sinkhorn_noise: float = 0.01  # Appendix D: P_init = P_WM + noise * sqrt(2 / (n + m)) * |N(0, 1)|
    checkpoint_every: int = 50
    seed: int = 0  # latent noise and the lambda sequence
    # after every epoch, log the midpoint's test loss (match_test_loss) on this many test batches; -1: all, 0: off
    epoch_test_batches: int = 16


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
    batches: int = 16  # training batches whose activations are recorded


@dataclass
class RotationMatcherConfig:
    """Paper 002: per-head closed-form rotation of Q/K and V/O with rescaling, MLP permutations by
    weight matching, the residual stream not aligned (or `orthogonal`: ours); factored interpolation."""

    _target_: str = "glmc.matching.rotation.RotationMatcher"
    name: str = "rotation"
    residual: ResidualClass = ResidualClass.none
    heads: UnitClass = UnitClass.none  # paper 002 keeps heads in place
    mlp: UnitClass = UnitClass.permutation
    rescale: bool = True
    qk: HeadForm = HeadForm.none
    vo: HeadForm = HeadForm.none
    max_iter: int = "${matcher.weight.max_iter}"  # type: ignore[assignment]
    tol: float = "${matcher.weight.tol}"  # type: ignore[assignment]
    vocabulary: str = "${matcher.weight.vocabulary}"


def _variant(base: str, cls: type, **own) -> Any:
    """A method that shares `matcher.<base>`'s settings (by interpolation) except `own`."""
    skip = {"_target_", "residual", "heads", "mlp", "units", "qk", "vo", *own}
    shared = {f.name: f"${{matcher.{base}.{f.name}}}" for f in fields(cls) if f.name not in skip}
    return lambda: cls(**shared, **own)


# name -> the config of that method with its defaults; the order is the plot order of `compare`.
METHODS: dict[str, Any] = {
    "vanilla": VanillaMatcherConfig,
    "canonical": CanonicalMatcherConfig,
    "weight_perm": _variant("weight", WeightMatcherConfig, name="weight_perm", residual=ResidualClass.permutation),
    "weight": WeightMatcherConfig,
    "activation": ActivationMatcherConfig,
    "activation_orth": _variant(
        "activation", ActivationMatcherConfig, name="activation_orth", residual_map=ResidualMap.orthogonal
    ),
    "rotation": RotationMatcherConfig,
    "learned": LearnedMatcherConfig,
    "learned_perm": _variant("learned", LearnedMatcherConfig, name="learned_perm", residual=ResidualClass.permutation),
    "learned_sinkhorn": _variant("learned", LearnedMatcherConfig, name="learned_sinkhorn", units=UnitLatent.sinkhorn),
}


@dataclass
class MatcherConfig:
    """Which methods a run evaluates (`methods`, in plot order) and every method's settings."""

    name: str = "compare"
    methods: list[str] = field(default_factory=lambda: ["vanilla"])
    vanilla: VanillaMatcherConfig = field(default_factory=METHODS["vanilla"])
    canonical: CanonicalMatcherConfig = field(default_factory=METHODS["canonical"])
    weight_perm: WeightMatcherConfig = field(default_factory=METHODS["weight_perm"])
    weight: WeightMatcherConfig = field(default_factory=METHODS["weight"])
    activation: ActivationMatcherConfig = field(default_factory=METHODS["activation"])
    activation_orth: ActivationMatcherConfig = field(default_factory=METHODS["activation_orth"])
    rotation: RotationMatcherConfig = field(default_factory=METHODS["rotation"])
    learned: LearnedMatcherConfig = field(default_factory=METHODS["learned"])
    learned_perm: LearnedMatcherConfig = field(default_factory=METHODS["learned_perm"])
    learned_sinkhorn: LearnedMatcherConfig = field(default_factory=METHODS["learned_sinkhorn"])


assert set(METHODS) == {f.name for f in fields(MatcherConfig)} - {"name", "methods"}, "register every method twice"


def check_methods(names: list[str]) -> None:
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        raise ValueError(f"matcher.methods contains {unknown}, which is not one of {list(METHODS)}")
    if not names:
        raise ValueError("matcher.methods is empty: name at least one of " + ", ".join(METHODS))


def method_config(cfg: DictConfig, name: str) -> DictConfig:
    """The node of method `name` inside a composed run config (interpolations resolve there)."""
    check_methods([name])
    return cfg.matcher[name]


def build_matcher(node: DictConfig) -> Any:
    """Instantiate one method's config node (`_target_` + constructor arguments)."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    try:
        return instantiate(node, _convert_="all")
    except InstantiationException as err:  # a bad setting: the constructor's own message names the key
        if isinstance(err.__cause__, (ValueError, TypeError)):
            raise err.__cause__ from None
        raise


def default_method_config(name: str, **options) -> DictConfig:
    """Method `name` with the schema defaults and `options` merged in, type-checked (a misspelled
    option fails naming it). Used by `glmc.align`, where no Hydra config exists."""
    from glmc.config import Config

    root = OmegaConf.structured(Config)
    node = method_config(root, name)
    if options:
        OmegaConf.set_struct(root, True)
        node.merge_with(options)
    return node
