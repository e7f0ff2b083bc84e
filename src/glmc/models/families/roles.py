"""Roles of canonical tensors: where each symmetry space acts, as data.

A `Role` names one canonical tensor ("{l}" for the layer) and lists its `Acts`: for a space kind (residual,
heads, qheads, qk, vo, mlp, mlp_scale, experts, expert_units, expert_scale, head_hidden), the axis the group
acts on and the side, "out" for a writer into the space (gets g), "in" for a reader (gets g's inverse
transpose); `head_axis` makes a space batched: one element per head (or expert). `stage` says where in the
stream the tensor sits. Each block kind lists the roles of its tensors (glmc.models.blocks); a
family lists its embedding and head roles. A space's axes are listed (and applied) in role order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch import Tensor

# the per-layer space kinds listed first, in this order (heads before the per-head qk and vo); a block kind's
# own spaces (a mixture's experts, then each expert's units) follow in the order its roles name them
LAYER_SPACES = ("heads", "qheads", "qk", "vo", "mlp", "mlp_scale")


def layer_space_order(kinds) -> tuple[str, ...]:
    """The per-layer space kinds among `kinds` (in the order roles name them): LAYER_SPACES first, then the
    others in their first-named order."""
    named = dict.fromkeys(k for k in kinds if k not in ("residual", HEAD_HIDDEN))
    return (*(k for k in LAYER_SPACES if k in named), *(k for k in named if k not in LAYER_SPACES))


# per-head attention pairs that the circuit form absorbs
HEAD_PAIRS = ("qk", "vo")
# the hidden state of a task head with a layer of its own (BERT's masked-LM transform or pooler)
HEAD_HIDDEN = "head_hidden"


@dataclass(frozen=True)
class Acts:
    space: str  # residual | heads | qheads | qk | vo | mlp | mlp_scale | experts | expert_units | expert_scale | ...
    axis: int
    side: str  # "out" | "in"
    head_axis: int | None = None
    extra: int = 0
    # an elementwise gain on the space (a norm's learned scale): sign flips leave it alone, permutations move it
    gain: bool = False


@dataclass(frozen=True)
class Role:
    name: str  # canonical name; "{l}" stands for the layer
    stage: str  # embed | attn | mlp | head
    acts: tuple[Acts, ...] = ()
    vocab_rows: bool = False  # rows indexed by token id (a language model's embedding and unembedding)
    # linear maps: the state the map reads (canonical_forward's recorded names) and its bias tensor
    reads: str | None = None
    bias: str | None = None

    def at(self, layer: int | None, name: str | None = None) -> str:
        """This role's tensor name (or `name`, one of its fields such as `reads`) at a layer."""
        name = self.name if name is None else name
        return name if layer is None else name.format(l=layer)

    def acts_on(self, space: str) -> tuple[Acts, ...]:
        return tuple(a for a in self.acts if a.space == space)


def writer(name: str, axis: int = 1, vocab_rows: bool = False) -> Role:
    """An embedding tensor writing into the residual stream along `axis`."""
    return Role(name, "embed", (Acts("residual", axis, "out"),), vocab_rows)


def linear_head(bias: bool = True, vocab_rows: bool = False) -> tuple[Role, ...]:
    """head.w reading the final stream, and its bias head.b."""
    w = Role("head.w", "head", (Acts("residual", 1, "in"),), vocab_rows, "final", "head.b" if bias else None)
    return (w, Role("head.b", "head")) if bias else (w,)


def block_role(name: str, stage: str, *acts: Acts, reads: str | None = None) -> Role:
    """The role of block tensor `name` ("q_w" for blocks.{l}.q_w); a linear map names the state it reads
    (its bias is the same name ending in "b")."""
    bias = "blocks.{l}." + name[:-1] + "b" if reads else None
    return Role("blocks.{l}." + name, stage, acts, reads=reads and "blocks.{l}." + reads, bias=bias)


# Post-norm blocks (BERT): the stream is the LayerNorms' output, so their gains and offsets write it
POST_NORMS = (
    block_role("ln1_w", "attn", Acts("residual", 0, "out", gain=True)),
    block_role("ln1_b", "attn", Acts("residual", 0, "out")),
    block_role("ln2_w", "mlp", Acts("residual", 0, "out", gain=True)),
    block_role("ln2_b", "mlp", Acts("residual", 0, "out")),
)

# the block tensors of a per-head pair (qk or vo) in factored form, whichever attention kind holds them
_PAIR_TENSORS = frozenset(f"blocks.{{l}}.{n}" for n in ("q_w", "q_b", "k_w", "k_b", "v_w", "v_b", "o_w"))

_LAYER = re.compile(r"blocks\.(\d+)\.")


def pair_factors(params: dict[str, Tensor], layer: int, pair: str, roles: tuple[Role, ...]) -> tuple[Tensor, Tensor]:
    """One per-head pair (qk or vo) of a factored block as (X, Y), each (H, d, n): the tensors writing
    into the pair (X = [W_q | b_q]) and reading it, head axis first, pair axis second, the rest flattened
    and joined in role order; the circuit is X^T Y. `roles`: the block's layout."""
    sides: dict[str, list[Tensor]] = {"out": [], "in": []}
    for role in roles:
        for acts in role.acts_on(pair):
            t = params[role.at(layer)].movedim((acts.head_axis, acts.axis), (0, 1))
            sides[acts.side].append(t.reshape(t.shape[0], t.shape[1], -1))
    return torch.cat(sides["out"], -1), torch.cat(sides["in"], -1)


def unit_rows(params: dict[str, Tensor], layer: int, space: str, roles: tuple[Role, ...]) -> Tensor:
    """Every unit of a per-layer unit space as one row, joined in role order (MLP: [W_in | b_in | W_out^T])."""
    rows = []
    for role in roles:
        for acts in role.acts_on(space):
            t = params[role.at(layer)].movedim(acts.axis, 0)
            rows.append(t.reshape(t.shape[0], -1))
    return torch.cat(rows, 1)


def in_head_pair(name: str) -> bool:
    """Whether a factored block tensor belongs to a per-head pair (q, k, v, o weights and q, k, v biases)."""
    return role_key(name) in _PAIR_TENSORS


def layer_of(name: str) -> int | None:
    """The layer of a block tensor's name, None outside the blocks."""
    m = _LAYER.match(name)
    return int(m.group(1)) if m else None


def role_key(name: str) -> str:
    """A canonical tensor name with its layer replaced by {l}: the key of its Role."""
    return _LAYER.sub("blocks.{l}.", name, count=1)
