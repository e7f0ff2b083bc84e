"""Plain ReLU-like MLP units up to their positive scale: act(a z) = a act(z) for a > 0, so a unit's in row
and bias may be scaled by a against its out column by 1/a. Weight matching compares units on a cost that
scale leaves unchanged, then sets it (engine/scales.best_scales, positive roots only)."""

from __future__ import annotations

import torch
from torch import Tensor

from glmc.matching.engine.scales import best_scales
from glmc.symmetry import PositiveDiagonal

Params = dict[str, Tensor]


def _sides(p: Params, layer: int) -> tuple[Tensor, Tensor]:
    """Per unit its in row [W_in | b_in] and its out column (as a row)."""
    pre = f"blocks.{layer}."
    return torch.cat([p[pre + "in_w"], p[pre + "in_b"][:, None]], 1), p[pre + "out_w"].T


def _unit(x: Tensor) -> Tensor:
    return x / x.norm(dim=1, keepdim=True).clamp_min(1e-12)


def scaled_mlp_similarity(pa: Params, pb: Params, layer: int) -> Tensor:
    """Cosine of the in rows plus cosine of the out columns: each unchanged by a unit's positive scale
    (the joined rows' cosine, mlp_units.mlp_similarity, is not)."""
    (xa, ya), (xb, yb) = _sides(pa, layer), _sides(pb, layer)
    return (_unit(xa) @ _unit(xb).T).add_(_unit(ya) @ _unit(yb).T)


def positive_unit_scales(pa: Params, pb: Params, layer: int) -> PositiveDiagonal:
    """Per unit (B's units already matched to A's) the a > 0 minimising ||x_A - a x_B||^2 + ||y_A - y_B / a||^2
    over in rows x and out columns y."""
    (xa, ya), (xb, yb) = ((t.double() for t in _sides(p, layer)) for p in (pa, pb))
    P, Q = xb.pow(2).sum(1), yb.pow(2).sum(1)
    return PositiveDiagonal(best_scales(P, (xa * xb).sum(1), Q, (ya * yb).sum(1)).float())
