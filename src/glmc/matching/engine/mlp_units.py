"""How weight matching compares MLP units: the cosine of their rows, or for a gated MLP its gate rows
and a cost the up/down scale leaves unchanged, and that scale once the units are matched."""

from __future__ import annotations

import torch
from torch import Tensor

from glmc.matching.engine.scales import best_scales, scale_objective
from glmc.models.blocks import plain
from glmc.models.families.roles import unit_rows
from glmc.symmetry import Diagonal

Params = dict[str, Tensor]


def mlp_similarity(pa: Params, pb: Params, layer: int) -> Tensor:
    fa, fb = unit_rows(pa, layer, "mlp", plain.ROLES), unit_rows(pb, layer, "mlp", plain.ROLES)
    # the joined rows are new tensors: normalised in place (the same floats, not held twice)
    fa.div_(fa.norm(dim=1, keepdim=True).clamp_min(1e-12))
    fb.div_(fb.norm(dim=1, keepdim=True).clamp_min(1e-12))
    return fa @ fb.T


def _gated_rows(p: Params, layer: int, branch: str) -> Tensor:
    """A gated MLP's rows per unit: [W | b] of the gate or in (up) branch, or the out (down) columns."""
    pre = f"blocks.{layer}."
    if branch == "out":
        return p[pre + "out_w"].T
    return torch.cat([p[pre + branch + "_w"], p[pre + branch + "_b"][:, None]], 1)


def gated_mlp_similarity(pa: Params, pb: Params, layer: int) -> Tensor:
    """Units of gated MLPs: cosine of the gate rows plus the product of the cosines of the up rows and
    the down columns, which a unit's scale (and sign) of up against down leaves unchanged."""

    def cosine(branch: str) -> Tensor:
        a, b = (_gated_rows(p, layer, branch) for p in (pa, pb))
        a = a / a.norm(dim=1, keepdim=True).clamp_min(1e-12)
        return a @ (b / b.norm(dim=1, keepdim=True).clamp_min(1e-12)).T

    # in place, the same floats: two (units x units) matrices held instead of four (a 1B model's MLP)
    return cosine("in").mul_(cosine("out")).add_(cosine("gate"))


def unit_scales(pa: Params, pb: Params, layer: int) -> Diagonal:
    """Per unit of a gated MLP (B's units already matched to A's) the non-zero s minimising
    ||up_A - s up_B||^2 + ||down_A - down_B / s||^2, the sign tried both ways (up_down_scales)."""
    xa, xb = _gated_rows(pa, layer, "in"), _gated_rows(pb, layer, "in")
    ya, yb = _gated_rows(pa, layer, "out"), _gated_rows(pb, layer, "out")
    return Diagonal(up_down_scales(xa, xb, ya, yb))


def up_down_scales(xa: Tensor, xb: Tensor, ya: Tensor, yb: Tensor) -> Tensor:
    """(...) per unit the non-zero s minimising ||x_A - s x_B||^2 + ||y_A - y_B / s||^2 (float32), from
    (..., n) up rows x and down columns y of matched units; s and -s both tried (a gated unit's sign is free)."""
    xa, xb, ya, yb = (t.double() for t in (xa, xb, ya, yb))
    shape = xb.shape[:-1]
    P, Q = xb.pow(2).sum(-1).flatten(), yb.pow(2).sum(-1).flatten()
    p, q = (xa * xb).sum(-1).flatten(), (ya * yb).sum(-1).flatten()
    positive, negative = best_scales(P, p, Q, q), best_scales(P, -p, Q, -q)
    flip = scale_objective(negative, P, -p, Q, -q) < scale_objective(positive, P, p, Q, q)
    return torch.where(flip, -negative, positive).reshape(shape).float()
