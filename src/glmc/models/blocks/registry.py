"""Block kinds by name: what a kind declares (BlockKind) and where each is defined, one module per kind.

Kind modules load on first use and this module imports none, so the canonical forward (which looks kinds up)
and the families (which name theirs) sit below them. A kind defined outside this package joins by
register_kind.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from types import SimpleNamespace
from typing import Any

from glmc.models.families.roles import HEAD_PAIRS, Role

# kind name -> the module that defines KIND; one line per kind
MODULES = {
    "full": "glmc.models.blocks.full",
    "grouped": "glmc.models.blocks.grouped",
    "qk_norm": "glmc.models.blocks.qk_norm",
    "qk_norm_all": "glmc.models.blocks.qk_norm_all",
    "plain": "glmc.models.blocks.plain",
    "gated": "glmc.models.blocks.gated",
    "sandwich": "glmc.models.blocks.sandwich",
    "moe": "glmc.models.blocks.moe",
    "moe_shared": "glmc.models.blocks.moe_shared",
}

# a kind's matching code, as a callable or a "module:attribute" string imported when a matcher first asks for it
# (kinds sit below glmc.matching, so they name its modules without importing them)
Hook = Callable | str


@dataclass(frozen=True)
class ActivationHook:
    """What activation matching does for a kind's own spaces: the states its forward records per layer (names
    after "blocks.{l}."), and match(moments, spec, layer, transform, correlation), which fills the kind's
    elements of layer `layer` into `transform` from the cross-moments of those states (moments, keyed by
    full name) and their mean correlations (before, after) into `correlation`."""

    states: tuple[str, ...]
    match: Hook


# the residual classes a block admits where it reads the stream through the pre-norm and writes it linearly
PRE_NORM_RESIDUAL = frozenset({"orthogonal", "signed_permutation", "permutation"})


@dataclass(frozen=True)
class BlockKind:
    """One sublayer kind: its forward, the roles of its tensors (the layout fragment it adds to each layer)
    and what it leaves of the symmetry group.

    forward: attention (config, params, pre, h, record) -> the branch's output (B, T, D); an MLP
    (config, params, pre, h, act, rec) -> the same. residual_classes: the residual classes that keep its
    function; head_spaces: the per-head spaces (qk, vo) its roles act on, which weight matching may map;
    circuit: the same sublayer in circuit form, None where it has none.

    What the matchers do for spaces of its own: weight_step(problem, options) -> a step weight matching runs
    every iteration after the MLP units (glmc.matching.engine.steps.Step's call), or None where `options`
    (the search's heads and mlp flags and the matcher's settings for kinds) leave it nothing to do;
    kept_spaces: the space kinds learned matching keeps as weight matching found them (no latent learns
    them); activation: its ActivationHook. settings: its settings and their defaults, which a model's
    CanonicalConfig.block_settings overrides (settings_of)."""

    name: str
    sublayer: str  # "attention" | "mlp" | "branch" (what a sublayer's output passes through: forward
    # (config, params, pre, sublayer, y) -> what joins the stream)
    forward: Callable
    roles: tuple[Role, ...]
    residual_classes: frozenset[str] = PRE_NORM_RESIDUAL
    head_spaces: frozenset[str] = frozenset()
    circuit: BlockKind | None = None
    # the classes of the heads space it keeps: copies of a head (semi-permutations) change a norm taken
    # over all heads' queries together, so such a kind keeps permutations only
    head_classes: tuple[str, ...] = ("permutation", "semi_permutation")
    weight_step: Hook | None = None
    kept_spaces: tuple[str, ...] = ()
    activation: ActivationHook | None = None
    settings: dict[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self):
        acting = {a.space for role in self.roles for a in role.acts if a.space in HEAD_PAIRS}
        if acting != set(self.head_spaces):
            raise ValueError(
                f"block kind {self.name!r} declares head spaces {sorted(self.head_spaces)} but its roles act on "
                f"{sorted(acting)}: list in head_spaces exactly the per-head spaces of its roles"
            )

    @property
    def grouped(self) -> bool:
        """Whether query heads sit in key/value groups (a qheads space within each head)."""
        return any(role.acts_on("qheads") for role in self.roles)

    def settings_of(self, config) -> SimpleNamespace:
        """Its settings for a model (attributes): the config's block_settings where they name them, else
        the defaults it declares."""
        given = config.block_settings
        return SimpleNamespace(**{key: given.get(key, default) for key, default in self.settings.items()})


def hook(ref: Hook) -> Callable:
    """The callable a kind's hook names: itself, or the attribute a "module:attribute" string names."""
    if callable(ref):
        return ref
    module, _, attribute = ref.partition(":")
    return getattr(importlib.import_module(module), attribute)


def kind_names() -> list[str]:
    return list(MODULES)


def register_kind(name: str, module: str) -> None:
    """Makes the kind that `module` (a dotted module path, outside this package or not) defines as KIND known
    by `name`, as a line of MODULES does; families then name it in attention_kind, mlp_kind or branch_kind."""
    if MODULES.get(name, module) != module:
        raise ValueError(f"block kind {name!r} is already {MODULES[name]}'s: register {module} under another name")
    MODULES[name] = module


@cache
def block_kind(name: str) -> BlockKind:
    """The block kind called `name` (a family's attention_kind or mlp_kind)."""
    if name not in MODULES:
        raise ValueError(f"unknown block kind {name!r}; known: {', '.join(MODULES)}")
    kind = importlib.import_module(MODULES[name]).KIND
    if kind.name != name:
        raise ValueError(f"{MODULES[name]} defines block kind {kind.name!r}, registered as {name!r}: use one name")
    return kind
