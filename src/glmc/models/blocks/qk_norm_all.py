"""Grouped-query attention with one RMSNorm over all heads' queries together and one over all keys (OLMo-2),
before rotary positions.

The tensors of blocks.grouped, plus q_norm (K, G, dh) and k_norm (K, dh): the gains of the norms over the
H * dh query and K * dh key coordinates, laid out by head like the queries and keys they scale; the
1/sqrt(dh) scale is folded into q_norm.

What keeps the function. The projections read the stream linearly, so residual maps act as on grouped
attention. A head permutation (key/value groups, query heads within a group) reorders the coordinates of
each norm, which keeps their RMS, so it permutes the gains with the heads; the roles put heads and qheads
on q_norm and k_norm. Copying a head (a semi-permutation) adds coordinates to the norm's mean and changes
every head's queries, so the heads keep permutations only (head_classes). Within a head, a map A of the
queries (keys) must keep the RMS over all heads and commute with the per-coordinate gain and with every
position's rotation: as for blocks.qk_norm, only a sign per rotary pair (-I on both coordinates, queries and
keys of a group alike) survives, a finite group weight matching does not search. So this block has no qk
space; the values and outputs keep their invertible vo maps.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from glmc.models.blocks import grouped
from glmc.models.blocks.registry import BlockKind
from glmc.models.families.roles import Acts, Role, block_role

H, QH = "heads", "qheads"


def _without_qk(role: Role) -> Role:
    return dataclasses.replace(role, acts=tuple(a for a in role.acts if a.space != "qk"))


ROLES = (
    *(_without_qk(role) for role in grouped.ROLES),
    block_role("q_norm", "attn", Acts(H, 0, "out"), Acts(QH, 1, "out", head_axis=0)),
    block_role("k_norm", "attn", Acts(H, 0, "out")),
)


def joint_norm(x: Tensor, gain: Tensor, eps: float) -> Tensor:
    """x (B, heads, T, dh) normalised by its RMS over all heads and dims at each position, times the gain
    (heads, dh)."""
    rms = torch.rsqrt(x.pow(2).mean((1, 3), keepdim=True) + eps)
    return x * rms * gain[:, None, :]


def attention(config, p, pre, h, record=None):
    def normed(q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        q_gain, k_gain = p[pre + "q_norm"].flatten(0, 1), p[pre + "k_norm"]
        return joint_norm(q, q_gain, config.norm_eps), joint_norm(k, k_gain, config.norm_eps)

    return grouped.attention(config, p, pre, h, record, before_rotary=normed)


KIND = BlockKind(
    "qk_norm_all", "attention", attention, ROLES, head_spaces=frozenset({"vo"}), head_classes=("permutation",)
)
