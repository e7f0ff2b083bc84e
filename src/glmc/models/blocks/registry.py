"""Block kinds by name: what a kind declares (BlockKind) and where each is defined, one module per kind.

Kind modules load on first use and this module imports none, so the canonical forward (which looks kinds up)
and the families (which name theirs) sit below them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

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

# the residual classes a block admits where it reads the stream through the pre-norm and writes it linearly
PRE_NORM_RESIDUAL = frozenset({"orthogonal", "permutation"})


@dataclass(frozen=True)
class BlockKind:
    """One sublayer kind: its forward, the roles of its tensors (the layout fragment it adds to each layer)
    and what it leaves of the symmetry group.

    forward: attention (config, params, pre, h, record) -> the branch's output (B, T, D); an MLP
    (config, params, pre, h, act, rec) -> the same. residual_classes: the residual classes that keep its
    function; head_spaces: the per-head spaces (qk, vo) its roles act on, which weight matching may map;
    circuit: the same sublayer in circuit form, None where it has none."""

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


def kind_names() -> list[str]:
    return list(MODULES)


@cache
def block_kind(name: str) -> BlockKind:
    """The block kind called `name` (a family's attention_kind or mlp_kind)."""
    if name not in MODULES:
        raise ValueError(f"unknown block kind {name!r}; known: {', '.join(MODULES)}")
    return importlib.import_module(MODULES[name]).KIND
