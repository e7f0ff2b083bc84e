"""In-head maps in closed form (paper 002 §4.2, derived in glmc.matching.rotation): per head the
orthogonal map and the scale moving B's pair of factors onto A's, and for grouped rotary blocks the
distance left after the best such maps and the maps themselves."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from glmc.matching.engine.projections import decomposed, polar_factors
from glmc.matching.engine.rotary_pairs import as_complex, pair_distance, passthrough_cost, rotary_scales, solve_pairs
from glmc.matching.engine.scales import best_scales, scale_objective
from glmc.models.blocks import grouped
from glmc.models.families.roles import HEAD_PAIRS, pair_factors
from glmc.symmetry import OrthogonalScale, Permutation, Transform

Params = dict[str, Tensor]
HEAD_PAIRS_SET = frozenset(HEAD_PAIRS)


def closed_form_rotations(xa: Tensor, ya: Tensor, xb: Tensor, yb: Tensor, group: str = "orthogonal") -> Tensor:
    """Per head the orthogonal R minimising ||X_A - R X_B||^2 + ||Y_A - R Y_B||^2, (H, d, d) float64; with
    group="permutation" the best permutation matrix instead (an assignment on the same cross-covariance:
    the in-head permutation baseline that rotation matching generalises)."""
    xa, ya, xb, yb = (t.double() for t in (xa, ya, xb, yb))
    m = xa @ xb.transpose(1, 2) + ya @ yb.transpose(1, 2)
    if group == "permutation":
        return torch.stack([Permutation.project(head).dense(torch.float64) for head in m])
    u, _, vh = decomposed(torch.linalg.svd, m)
    return u @ vh


def pair_objective(xa: Tensor, ya: Tensor, xb: Tensor, yb: Tensor, rotations: Tensor, scales: Tensor) -> Tensor:
    """Per head ||X_A - a R X_B||^2 + ||Y_A - R Y_B / a||^2, (H,) float64."""
    xa, ya, xb, yb, r, s = (t.double() for t in (xa, ya, xb, yb, rotations, scales))
    s = s[:, None, None]
    return (xa - s * r @ xb).pow(2).sum((1, 2)) + (ya - r @ yb / s).pow(2).sum((1, 2))


def _best_scale(xx: float, xy: float, yx: float, yy: float) -> float:
    """argmin_{a > 0} a^2 xx - 2 a xy + yy / a^2 - 2 yx / a, with xx = |X_B|^2, xy = <X_A, R X_B>,
    yx = <Y_A, R Y_B>, yy = |Y_B|^2; a = 1 where a side is zero (the objective does not bound a)."""
    if xx <= 0 or yy <= 0:
        return 1.0
    roots = np.roots([xx, -xy, 0.0, yx, -yy])
    real = roots[np.abs(roots.imag) <= 1e-8 * np.maximum(1.0, np.abs(roots))].real
    candidates = [1.0] + [float(r) for r in real if r > 0]
    value = lambda a: a * a * xx - 2 * a * xy + yy / (a * a) - 2 * yx / a  # noqa: E731
    return min(candidates, key=value)


def optimal_scales(xa: Tensor, ya: Tensor, xb: Tensor, yb: Tensor, rotations: Tensor) -> Tensor:
    """Per head the a > 0 minimising pair_objective for the given rotations (paper 002 Eq. 11-12), (H,)."""
    xa, ya, xb, yb, r = (t.double() for t in (xa, ya, xb, yb, rotations))
    rxb, ryb = r @ xb, r @ yb
    xx, yy = xb.pow(2).sum((1, 2)), yb.pow(2).sum((1, 2))
    xy, yx = (xa * rxb).sum((1, 2)), (ya * ryb).sum((1, 2))
    scales = [_best_scale(*(float(t[h]) for t in (xx, xy, yx, yy))) for h in range(len(r))]
    return torch.tensor(scales, dtype=torch.float64, device=r.device)


def rotary_head_cost(
    pa: Params, pb: Params, layer: int, rotary_dims: int | None = None, qk_maps: bool = True
) -> Tensor:
    """(H_A, H_B) factored distance between query heads of grouped rotary blocks (with their groups' keys
    and values) after the best in-head maps for each pair: rotary rotation-scalings on q/k (none where
    `qk_maps` is False: a block without a qk space), paper 002's rotation and rescaling on v/o, the best
    orthogonal map on partial rotary's unrotated dims; float64."""
    pre = f"blocks.{layer}."

    def heads(p: Params) -> tuple[Tensor, ...]:
        aug = lambda n: torch.cat([p[pre + n + "_w"], p[pre + n + "_b"][..., None]], -1).double()  # noqa: E731
        q = aug("q")
        group = q.shape[1]
        per_head = lambda t: t.repeat_interleave(group, 0)  # noqa: E731  a group's rows for each query head
        o = p[pre + "o_w"].flatten(0, 1).transpose(1, 2).double()
        return q.flatten(0, 1), per_head(aug("k")), per_head(aug("v")), o

    qa, ka, va, oa = heads(pa)
    qb, kb, vb, ob = heads(pb)
    rotary = qa.shape[1] if rotary_dims is None else rotary_dims
    norms = lambda t: t.abs().pow(2).sum(-1)  # noqa: E731
    if qk_maps:
        za, ua, zb, ub = (as_complex(t[:, :rotary]) for t in (qa, ka, qb, kb))
        moment = lambda x, y: torch.einsum("ifn,jfn->ijf", x, y.conj())  # noqa: E731
        cz, cu = moment(za, zb), moment(ua, ub)
        P, Q = norms(zb)[None].expand_as(cz.real), norms(ub)[None].expand_as(cz.real)
        w = solve_pairs(cz, cu, P, Q)
        qk = pair_distance(w, cz, cu, P, Q, norms(za)[:, None], norms(ua)[:, None]).sum(-1)
    else:
        qk = torch.cdist(torch.cat([qa, ka], 1).flatten(1), torch.cat([qb, kb], 1).flatten(1)).pow(2)
    if qk_maps and rotary < qa.shape[1]:
        qk = qk + passthrough_cost(*(t[:, rotary:] for t in (qa, ka, qb, kb)))
    gv = torch.einsum("ide,jfe->ijdf", va, vb)
    go = torch.einsum("ide,jfe->ijdf", oa, ob)
    r = polar_factors(gv + go)
    pv, po = (r * gv).sum((-1, -2)), (r * go).sum((-1, -2))
    Pv, Po = norms(vb).sum(-1)[None].expand_as(pv), norms(ob).sum(-1)[None].expand_as(pv)
    scale = best_scales(Pv, pv, Po, po).reshape(pv.shape)
    vo = scale_objective(scale, Pv, pv, Po, po) + norms(va).sum(-1)[:, None] + norms(oa).sum(-1)[:, None]
    return (qk + vo).clamp_min(0).sqrt()


def in_head_maps(
    pa: Params, pb: Params, layers: range, rotary_dims: int | None = None, pairs: frozenset[str] = HEAD_PAIRS_SET
) -> Transform:
    """For grouped rotary blocks interpolated as factored weights: per layer the qk rotation-scalings
    (per frequency pair; orthogonal maps of the dims partial rotary leaves, `rotary_dims`) and vo rotations
    with rescaling (per group) moving B's heads onto A's; only the `pairs` that are spaces of the model."""
    out = Transform()
    for layer in layers:
        if "qk" in pairs:
            (xa, ya), (xb, yb) = (pair_factors(p, layer, "qk", grouped.ROLES) for p in (pa, pb))
            out[f"qk.{layer}"] = rotary_scales(xa, ya, xb, yb, rotary_dims=rotary_dims).to(dtype=torch.float32)
        if "vo" not in pairs:
            continue
        (xa, ya), (xb, yb) = (pair_factors(p, layer, "vo", grouped.ROLES) for p in (pa, pb))
        rotations = closed_form_rotations(xa, ya, xb, yb)
        scales = optimal_scales(xa, ya, xb, yb, rotations)
        out[f"vo.{layer}"] = OrthogonalScale(rotations.float(), scales.float())
    return out
