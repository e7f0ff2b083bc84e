"""Grouped-query attention with an RMSNorm on each head's queries and keys (Qwen3), before rotary positions.

The tensors of blocks.grouped, plus q_norm and k_norm (dh): one gain each, shared by all heads, applied
after normalising a head's query (key) over its dh dims; the 1/sqrt(dh) scale is folded into q_norm.

What keeps the function. The projections read the pre-normed stream, so residual orthogonal maps and
permutations act as on grouped attention; heads permute with their groups (and query heads within one)
because every head shares the gains; a group's values and outputs keep their invertible vo maps. A map A
of a head's queries (keys) must satisfy norm(A q) * gain = A' (norm(q) * gain) for a map A' the scores
undo under every position's rotation: an RMS norm is equivariant only to orthogonal maps, the diagonal
gain commutes only with maps within its equal entries, and the rotation only with maps acting on each
frequency pair as a rotation-scaling. What survives for a generic gain is a sign per rotary pair, -I on
both coordinates of the pair (it commutes with the rotation and the gain, keeps the RMS), applied to the
queries and keys of a group alike: a finite group weight matching does not search. So this block has no
qk space: its roles put none on q_w, k_w and their biases, the gains are acted on by nothing, and the
symmetry group (glmc.symmetry) follows from the roles.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from glmc.models.blocks import grouped
from glmc.models.blocks.registry import BlockKind
from glmc.models.families.roles import Role, block_role


def _without_qk(role: Role) -> Role:
    return dataclasses.replace(role, acts=tuple(a for a in role.acts if a.space != "qk"))


ROLES = (
    *(_without_qk(role) for role in grouped.ROLES),
    block_role("q_norm", "attn"),  # the gains: no space acts on them
    block_role("k_norm", "attn"),
)


def head_norm(x: Tensor, gain: Tensor, eps: float) -> Tensor:
    """RMS norm of each head's vector over its last axis, times the gain shared by the heads."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gain


def attention(config, p, pre, h, record=None):
    def normed(q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return head_norm(q, p[pre + "q_norm"], config.norm_eps), head_norm(k, p[pre + "k_norm"], config.norm_eps)

    return grouped.attention(config, p, pre, h, record, before_rotary=normed)


KIND = BlockKind("qk_norm", "attention", attention, ROLES, head_spaces=frozenset({"vo"}))
