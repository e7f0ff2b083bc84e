"""The one registry of alignment methods: a structured config per method, built by `instantiate`.

Each entry is a dataclass whose `_target_` names the matcher class and whose other fields are that
class's constructor arguments. `run.py` composes them under `matcher.<name>` (so every option is
type-checked at composition and overridable, e.g. `matcher.weight.max_iter=5`), and `glmc.align`
builds the same nodes from Python. Symmetry classes default to the run's `symmetry` group by
interpolation; outside Hydra they resolve against the schema's defaults.

Multi-model methods (`pairing=universe`, `multi.methods`) are registered here too, in MULTI_METHODS.

What a `_target_` may name (`matcher_target_problem`, checked by the config check before any work and by
`build_matcher`): one of the registry's own classes (REGISTERED_TARGETS), or a class that declares the
matcher interface explicitly, by subclassing `glmc.matching.base.Matcher`, and defines its own
`match(self, a, b, context)`; its constructor takes the node's other keys. Anything else (a function such
as `builtins.print`, a class that is no matcher, a name that does not import) is refused by name before
anything is called.

This module imports no matcher and not glmc.config: the classes are loaded by `instantiate` when a
method is built, and the settings groups they share with the schema live in glmc.matching.settings.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields, make_dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

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
from glmc.matching.settings import LearnedTraining, SymmetryConfig, UniverseTraining


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
class LearnedMatcherConfig(LearnedTraining):
    """Paper 001 §4.2 learned matching: the training settings of LearnedTraining (their defaults and
    meaning are declared there) and which spaces are learned, from what start."""

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


# name -> the method's config and defaults, registered here only (the `matcher` schema below is made
# from it); the order is the plot order of `compare`.
METHODS: dict[str, Method] = {
    "vanilla": Method(VanillaMatcherConfig, VanillaMatcherConfig),
    "canonical": Method(CanonicalMatcherConfig, CanonicalMatcherConfig),
    "weight_perm": _variant("weight", WeightMatcherConfig, name="weight_perm", residual=ResidualClass.permutation),
    "weight": Method(WeightMatcherConfig, WeightMatcherConfig),
    "activation": Method(ActivationMatcherConfig, ActivationMatcherConfig),
    "activation_orth": _variant(
        "activation", ActivationMatcherConfig, name="activation_orth", residual_map=ResidualMap.orthogonal
    ),
    "rotation": Method(RotationMatcherConfig, RotationMatcherConfig),
    "learned": Method(LearnedMatcherConfig, LearnedMatcherConfig),
    "learned_perm": _variant("learned", LearnedMatcherConfig, name="learned_perm", residual=ResidualClass.permutation),
    "learned_sinkhorn": _variant("learned", LearnedMatcherConfig, name="learned_sinkhorn", units=UnitLatent.sinkhorn),
}

# the classes the registry's methods build: a `_target_` may name these without further checks
REGISTERED_TARGETS = frozenset(
    f.default for method in METHODS.values() for f in fields(method.schema) if f.name == "_target_"
)

# The `matcher` group's schema: which methods a run evaluates (`methods`, in plot order) and one node
# per registered method, `matcher.<name>`.
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
    """A multi-model method (`multi.methods`, pairing=universe): how the endpoints are aligned before
    the simplex they span is evaluated."""

    universe: bool  # aligned to a shared universe by the pairwise method `multi.pairwise`; else as trained
    # then refined by this function (a dotted path, like `_target_`) with every setting of `settings`,
    # read from `multi.*`: refine(universe_alignment, context, where="multi", **settings)
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


def check_multi_methods(names: list[str]) -> None:
    unknown = [n for n in names if n not in MULTI_METHODS]
    if unknown or not names:
        raise ValueError(f"multi.methods={names}: choose one or more of {', '.join(MULTI_METHODS)}")


def build_refinement(name: str, multi: Any) -> Callable[..., Any] | None:
    """Multi-model method `name`'s refinement of a universe alignment, with its settings read from the
    `multi` node (every field of the method's settings dataclass); None for a method without one."""
    import functools

    from hydra.utils import get_method

    method = MULTI_METHODS[name]
    if method.refine is None:
        return None
    values = {f.name: multi[f.name] for f in fields(method.settings)}
    return functools.partial(get_method(method.refine), where="multi", **values)


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


def _locate(path: str) -> Any:
    """The object a dotted path names, imported but not called; ImportError or AttributeError if none."""
    parts = path.split(".")
    for end in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:end]))
        except ImportError:
            continue
        for attr in parts[end:]:
            found = getattr(found, attr)
        return found
    raise ImportError(f"no module of {path!r} can be imported")


def _target_reason(target: Any, keys: Iterable[str]) -> str | None:
    """Why `target` cannot be a matcher class whose constructor takes `keys`; None when it can."""
    from glmc.matching.base import Matcher

    if target in REGISTERED_TARGETS:
        return None
    try:
        found = _locate(str(target))
    except (ImportError, AttributeError, ValueError) as err:
        return f"names nothing that can be imported ({err})"
    if not inspect.isclass(found):
        return f"is a {type(found).__name__}, not a matcher class"
    if Matcher not in found.__mro__[1:]:
        return "is a class that does not subclass glmc.matching.base.Matcher, the matcher interface"
    match = getattr(found, "match", None)
    if match is Matcher.match or not callable(match):
        return "subclasses glmc.matching.base.Matcher but defines no match(a, b, context) of its own"
    try:
        inspect.signature(match).bind(None, "a", "b", "context")
        inspect.signature(found).bind(**dict.fromkeys(keys))
    except TypeError as err:
        return f"does not take the matcher's arguments: match(a, b, context) and the node's settings ({err})"
    return None


def default_target(name: str) -> str:
    """The class registered method `name` builds."""
    return next(f.default for f in fields(METHODS[name].schema) if f.name == "_target_")


def matcher_target_problem(node: Any, where: str, default: str | None = None) -> str | None:
    """A message naming `where`._target_, why its value is refused and what to set instead; None if it
    names a matcher class (module docstring)."""
    target = node.get("_target_")
    reason = _target_reason(target, [k for k in node.keys() if k != "_target_"])
    if reason is None:
        return None
    back = f"set it back to {default}, the registry's class, or " if default else ""
    return (
        f"{where}._target_={target}: {reason}; {back}name a class that subclasses glmc.matching.base.Matcher "
        "and defines match(self, a, b, context)"
    )


def build_matcher(node: DictConfig) -> Any:
    """Instantiate one method's config node (`_target_` + constructor arguments), after checking that
    `_target_` names a matcher class (module docstring)."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    name = str(node.get("name", ""))
    problem = matcher_target_problem(node, f"matcher.{name}", default_target(name) if name in METHODS else None)
    if problem:
        raise ValueError(problem)
    try:
        return instantiate(node, _convert_="all")
    except InstantiationException as err:  # a bad setting: the constructor's own message names the key
        if isinstance(err.__cause__, (ValueError, TypeError)):
            raise err.__cause__ from None
        raise


@dataclass
class _MethodDefaults:
    """What method nodes interpolate from outside a run: the `symmetry` group and the other methods."""

    symmetry: SymmetryConfig = field(default_factory=SymmetryConfig)
    matcher: MatcherConfig = field(default_factory=MatcherConfig)  # type: ignore[valid-type]


def default_method_config(name: str, **options) -> DictConfig:
    """Method `name` with the schema defaults and `options` merged in, type-checked (a misspelled
    option fails naming it). Used by `glmc.align`, where no Hydra config exists."""
    root = OmegaConf.structured(_MethodDefaults)
    node = method_config(root, name)
    if options:
        OmegaConf.set_struct(root, True)
        node.merge_with(options)
    return node
