"""Roles of canonical tensors: where each symmetry space acts, as data.

A `Role` names one canonical tensor ("{l}" for the layer) and lists its `Acts`: for a space kind
(residual, heads, qheads, qk, vo, mlp, mlp_scale, head_hidden), the axis the group acts on and the side,
"out" for a writer into the space (gets g), "in" for a reader (gets g's inverse transpose). `stage` says
where in the stream the tensor sits. The block layouts below are shared by the families; a family lists
its embedding and head roles. A space's axes are listed (and applied) in role order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch import Tensor

# the per-layer space kinds, in the order their spaces are listed (heads before the per-head qk and vo)
LAYER_SPACES = ("heads", "qheads", "qk", "vo", "mlp", "mlp_scale")
# per-head attention pairs that the circuit form absorbs
HEAD_PAIRS = ("qk", "vo")
# the hidden state of a task head with a layer of its own (BERT's masked-LM transform or pooler)
HEAD_HIDDEN = "head_hidden"


@dataclass(frozen=True)
class Acts:
    space: str  # residual | heads | qheads | qk | vo | mlp | mlp_scale
    axis: int
    side: str  # "out" | "in"
    head_axis: int | None = None
    extra: int = 0


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


def _block(name: str, stage: str, *acts: Acts, reads: str | None = None) -> Role:
    bias = "blocks.{l}." + name[:-1] + "b" if reads else None
    return Role("blocks.{l}." + name, stage, acts, reads=reads and "blocks.{l}." + reads, bias=bias)


R, H, QH, QK, VO, M, MS = "residual", "heads", "qheads", "qk", "vo", "mlp", "mlp_scale"

_MLP = (
    _block("in_w", "mlp", Acts(R, 1, "in"), Acts(M, 0, "out"), reads="mlp_in"),
    _block("in_b", "mlp", Acts(M, 0, "out")),
    _block("out_w", "mlp", Acts(R, 0, "out"), Acts(M, 1, "in"), reads="mlp_act"),
    _block("out_b", "mlp", Acts(R, 0, "out")),
)

# q k^T is unchanged by q -> A q, k -> A^-T k; o_w v by v -> B v, o_w -> o_w B^-1
PRE_NORM_FACTORED = (
    _block("q_w", "attn", Acts(R, 2, "in"), Acts(H, 0, "out"), Acts(QK, 1, "out", head_axis=0), reads="attn_in"),
    _block("q_b", "attn", Acts(H, 0, "out"), Acts(QK, 1, "out", head_axis=0)),
    _block("k_w", "attn", Acts(R, 2, "in"), Acts(H, 0, "out"), Acts(QK, 1, "in", head_axis=0), reads="attn_in"),
    _block("k_b", "attn", Acts(H, 0, "out"), Acts(QK, 1, "in", head_axis=0)),
    _block("v_w", "attn", Acts(R, 2, "in"), Acts(H, 0, "out"), Acts(VO, 1, "out", head_axis=0), reads="attn_in"),
    _block("v_b", "attn", Acts(H, 0, "out"), Acts(VO, 1, "out", head_axis=0)),
    _block("o_w", "attn", Acts(R, 1, "out"), Acts(H, 0, "in"), Acts(VO, 2, "in", head_axis=0), reads="heads"),
    _block("o_b", "attn", Acts(R, 0, "out")),
    *_MLP,
)

# QK (H, D+1, D+1) reads [x; 1] on both sides; OV (H, D, D+1) writes D and reads [x; 1]
PRE_NORM_CIRCUIT = (
    _block("qk", "attn", Acts(R, 1, "in", extra=1), Acts(R, 2, "in", extra=1), Acts(H, 0, "out")),
    _block("ov", "attn", Acts(R, 1, "out"), Acts(R, 2, "in", extra=1), Acts(H, 0, "in")),
    _block("o_b", "attn", Acts(R, 0, "out")),
    *_MLP,
)

BLOCKS = {"factored": PRE_NORM_FACTORED, "circuit": PRE_NORM_CIRCUIT}

# Post-norm blocks (BERT): the stream is the LayerNorms' output, so their gains and offsets write it
_POST_NORMS = (
    _block("ln1_w", "attn", Acts(R, 0, "out")),
    _block("ln1_b", "attn", Acts(R, 0, "out")),
    _block("ln2_w", "mlp", Acts(R, 0, "out")),
    _block("ln2_b", "mlp", Acts(R, 0, "out")),
)
POST_NORM_BLOCKS = {form: (*roles, *_POST_NORMS) for form, roles in BLOCKS.items()}

# Gated grouped-query blocks (Llama), K key/value heads each shared by G query heads: q_w (K, G, dh, D),
# k_w, v_w (K, dh, D), o_w (K, G, D, dv). heads: the groups; qheads: the query heads within a group; qk, vo:
# one element per group; mlp_scale: the linear up branch's unit rows may be scaled against out_w's columns.
GATED_GROUPED = (
    _block(
        "q_w",
        "attn",
        Acts(R, 3, "in"),
        Acts(H, 0, "out"),
        Acts(QH, 1, "out", head_axis=0),
        Acts(QK, 2, "out", head_axis=0),
        reads="attn_in",
    ),
    _block("q_b", "attn", Acts(H, 0, "out"), Acts(QH, 1, "out", head_axis=0), Acts(QK, 2, "out", head_axis=0)),
    *PRE_NORM_FACTORED[2:6],  # k and v: one head per group
    _block(
        "o_w",
        "attn",
        Acts(R, 2, "out"),
        Acts(H, 0, "in"),
        Acts(QH, 1, "in", head_axis=0),
        Acts(VO, 3, "in", head_axis=0),
        reads="heads",
    ),
    _block("o_b", "attn", Acts(R, 0, "out")),
    _block("gate_w", "mlp", Acts(R, 1, "in"), Acts(M, 0, "out"), reads="mlp_in"),
    _block("gate_b", "mlp", Acts(M, 0, "out")),
    _block("in_w", "mlp", Acts(R, 1, "in"), Acts(M, 0, "out"), Acts(MS, 0, "out"), reads="mlp_in"),
    _block("in_b", "mlp", Acts(M, 0, "out"), Acts(MS, 0, "out")),
    _block("out_w", "mlp", Acts(R, 0, "out"), Acts(M, 1, "in"), Acts(MS, 1, "in"), reads="mlp_act"),
    _block("out_b", "mlp", Acts(R, 0, "out")),
)

# Grouped-query attention with a plain MLP (GPT-NeoX: one query head per key/value head)
GROUPED_PLAIN = (*GATED_GROUPED[:8], *_MLP)

_LAYER = re.compile(r"blocks\.(\d+)\.")
_FACTORED_BY_KEY = {role.name: role for role in PRE_NORM_FACTORED}


def block_roles(form: str, norm: str = "pre") -> tuple[Role, ...]:
    """The roles of one block's tensors, pre-norm or post-norm."""
    if form not in BLOCKS:
        raise ValueError(f"unknown form {form!r}; known: {', '.join(BLOCKS)}")
    return (BLOCKS if norm == "pre" else POST_NORM_BLOCKS)[form]


def pair_factors(
    params: dict[str, Tensor], layer: int, pair: str, roles: tuple[Role, ...] = PRE_NORM_FACTORED
) -> tuple[Tensor, Tensor]:
    """One per-head pair (qk or vo) of a factored block as (X, Y), each (H, d, n): the tensors writing
    into the pair (X = [W_q | b_q]) and reading it, head axis first, pair axis second, the rest flattened
    and joined in role order; the circuit is X^T Y. `roles`: the block's layout."""
    sides: dict[str, list[Tensor]] = {"out": [], "in": []}
    for role in roles:
        for acts in role.acts_on(pair):
            t = params[role.at(layer)].movedim((acts.head_axis, acts.axis), (0, 1))
            sides[acts.side].append(t.reshape(t.shape[0], t.shape[1], -1))
    return torch.cat(sides["out"], -1), torch.cat(sides["in"], -1)


def unit_rows(params: dict[str, Tensor], layer: int, space: str, roles: tuple[Role, ...] = PRE_NORM_FACTORED) -> Tensor:
    """Every unit of a per-layer unit space as one row, joined in role order (MLP: [W_in | b_in | W_out^T])."""
    rows = []
    for role in roles:
        for acts in role.acts_on(space):
            t = params[role.at(layer)].movedim(acts.axis, 0)
            rows.append(t.reshape(t.shape[0], -1))
    return torch.cat(rows, 1)


def in_head_pair(name: str) -> bool:
    """Whether a factored block tensor belongs to a per-head pair (q, k, v, o weights and q, k, v biases)."""
    role = _FACTORED_BY_KEY.get(role_key(name))
    return role is not None and any(a.space in HEAD_PAIRS for a in role.acts)


def layer_of(name: str) -> int | None:
    """The layer of a block tensor's name, None outside the blocks."""
    m = _LAYER.match(name)
    return int(m.group(1)) if m else None


def role_key(name: str) -> str:
    """A canonical tensor name with its layer replaced by {l}: the key of its Role."""
    return _LAYER.sub("blocks.{l}.", name, count=1)
