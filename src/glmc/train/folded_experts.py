"""Grouped expert products under vmap in one call: the members' expert groups folded into one list of
groups. Mixtures of experts run their experts as torch._grouped_mm (tokens sorted by expert, `offs` the
end of each expert's rows), for which vmap has no batching rule on any device: it called the kernel once
per member, stacked the outputs, and in the backward built a zero tensor of all K members' shape for each
member's slice of each gradient (select_backward), work that grows as K squared. Folded, member k's tokens
follow member k-1's, its experts' weights follow theirs and its group ends are shifted by k times a member's
row count, so one call computes every member's groups, each the product its own call computes (the kernel
treats groups independently): a member's experts, forward and backward, are what they are alone.
`FoldedExperts()` is a mode that routes 2-D x 3-D grouped products (the experts' forward; autograd then
differentiates the folded call) through the fold while it is entered; everything else passes through."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from glmc.train.folded_call import FoldedCall, FoldingMode, in_front

GROUPED = tuple(f for f in (getattr(F, "grouped_mm", None), getattr(torch, "_grouped_mm", None)) if f is not None)


class _Folded(FoldedCall):
    @staticmethod
    def forward(rows, weight, offs):
        return torch._grouped_mm(rows, weight, offs=offs)

    @staticmethod
    def vmap(info, in_dims, rows, weight, offs):
        members = info.batch_size
        rows, weight, offs = (in_front(t, d, members) for t, d in zip((rows, weight, offs), in_dims))
        count = rows.shape[1]  # a member's rows: its groups end at offs[k][-1] == count
        shift = torch.arange(members, device=offs.device, dtype=offs.dtype).mul_(count).unsqueeze(1)
        out = torch._grouped_mm(
            rows.reshape(members * count, rows.shape[-1]),
            weight.reshape(members * weight.shape[1], *weight.shape[2:]),
            offs=(offs + shift).reshape(-1),
        )
        return out.view(members, count, out.shape[-1]), 0


def _grouped(mat_a, mat_b, *, offs=None, bias=None, out_dtype=None, func=torch._grouped_mm):
    if mat_a.ndim != 2 or mat_b.ndim != 3 or offs is None or bias is not None or out_dtype is not None:
        return func(mat_a, mat_b, offs=offs, bias=bias, out_dtype=out_dtype)
    return _Folded.apply(mat_a, mat_b, offs)


class FoldedExperts(FoldingMode):
    routes = {f: functools.partial(_grouped, func=f) for f in GROUPED}
