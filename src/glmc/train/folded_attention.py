"""SDPA under vmap in one call: the members folded into the batch axis. vmap has no batching rule for
SDPA's CPU kernel (its CUDA kernels have theirs) and falls back to one call per member, with a copy of
every output; folded, the kernel runs once over all members' (batch, head) rows, each computed as a
member's own call computes it (the kernel treats rows independently), so a member's attention, forward and
backward, is what it is alone. `FoldedAttention()` is a mode that routes
torch.nn.functional.scaled_dot_product_attention through the fold while it is entered (the ensemble
enters it around its vmapped call); everything else passes through."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from glmc.train.folded_call import FoldedCall, FoldingMode, in_front

FOLDED_RANK = 4  # (batch, heads, tokens, features): the layout every family's attention passes


def _fold(t: torch.Tensor, dim: int | None, members: int, rows: int) -> torch.Tensor:
    """`t` with the member axis (`dim`; None: one tensor for all) in front, merged with its batch rows."""
    t = in_front(t, dim, members)
    t = t.reshape(members, *([1] * (1 + FOLDED_RANK - t.ndim)), *t.shape[1:])  # a broadcast mask's missing axes
    return t.expand(members, rows, *t.shape[2:]).reshape(members * rows, *t.shape[2:])


class _Folded(FoldedCall):
    @staticmethod
    def forward(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa):
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa
        )

    @staticmethod
    def vmap(info, in_dims, q, k, v, mask, dropout_p, is_causal, scale, enable_gqa):
        members = info.batch_size
        per_member = q.shape[1:] if in_dims[0] is not None else q.shape
        rows = per_member[0]
        folded = [_fold(t, d, members, rows) for t, d in zip((q, k, v), in_dims[:3])]
        mask = None if mask is None else _fold(mask, in_dims[3], members, rows)
        out = F.scaled_dot_product_attention(
            *folded, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa
        )
        return out.view(members, rows, *out.shape[1:]), 0


def _attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if q.ndim != FOLDED_RANK or k.ndim != FOLDED_RANK or v.ndim != FOLDED_RANK:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa
        )
    return _Folded.apply(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


class FoldedAttention(FoldingMode):
    routes = {F.scaled_dot_product_attention: _attention}
