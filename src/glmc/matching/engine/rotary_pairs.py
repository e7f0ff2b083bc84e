"""Closed-form rotation-scaling of rotary query/key pairs (the qk group of Llama-style models).

Per frequency pair (i, i + d/2) the only symmetry is a complex w = s e^{i phi} (RotaryScale): queries get
w, keys 1/conj(w). With z = x_i + i x_{i+d/2} for query rows and u for key rows, per pair
    sum |zA - w zB|^2 + sum |uA - uB / conj(w)|^2
    = s^2 P - 2 s Re(e^{-i phi} cz) + Q / s^2 - 2 Re(e^{-i phi} cu) / s + const,
with cz = sum zA conj(zB), cu = sum uA conj(uB), P = sum |zB|^2, Q = sum |uB|^2. For fixed s the best phi
is arg(s cz + cu / s); for fixed phi, s solves paper 002's quartic; alternating from s = 1 never increases
the objective. Partial rotary's pass-through dims get the orthogonal Procrustes map (M^-T = M).
"""

from __future__ import annotations

import torch
from torch import Tensor

from glmc.matching.engine.projections import decomposed, polar_factors
from glmc.matching.engine.scales import best_scales
from glmc.symmetry.groups import RotaryScale


def as_complex(x: Tensor) -> Tensor:
    """(K, d, n) rows -> (K, d/2, n) complex, pairing row i with row i + d/2 (rotate-half layout)."""
    half = x.shape[1] // 2
    x = x.double()
    return torch.complex(x[:, :half], x[:, half:])


def solve_pairs(cz: Tensor, cu: Tensor, P: Tensor, Q: Tensor, rescale: bool = True, rounds: int = 3) -> Tensor:
    """The complex w per pair from its moments (module docstring), float64 complex, shape of cz."""
    s = torch.ones_like(P)
    phase = torch.angle(cz + cu)
    for _ in range(rounds if rescale else 0):
        turn = torch.polar(torch.ones_like(phase), -phase)
        s = best_scales(P, (turn * cz).real, Q, (turn * cu).real).reshape(P.shape)
        phase = torch.angle(s * cz + cu / s)
    return torch.polar(s, phase)


def pair_distance(w: Tensor, cz: Tensor, cu: Tensor, P: Tensor, Q: Tensor, za2: Tensor, ua2: Tensor) -> Tensor:
    """sum |zA - w zB|^2 + sum |uA - uB / conj(w)|^2 per pair, from the moments and |zA|^2, |uA|^2."""
    s2 = w.abs().pow(2)
    return za2 + s2 * P - 2 * (w.conj() * cz).real + ua2 + Q / s2 - 2 * (cu * w.conj()).real / s2


def passthrough_moments(xa: Tensor, ya: Tensor, xb: Tensor, yb: Tensor) -> Tensor:
    """sum xA xB^T + sum yA yB^T over the rows' entries, per pair of heads (A's i, B's j): (I, J, p, p) for
    the pass-through dims (xa (I, p, n), ya (I, p, m), xb, yb likewise), float64."""
    xa, ya, xb, yb = (t.double() for t in (xa, ya, xb, yb))
    return torch.einsum("idn,jen->ijde", xa, xb) + torch.einsum("idn,jen->ijde", ya, yb)


def passthrough_cost(xa: Tensor, ya: Tensor, xb: Tensor, yb: Tensor) -> Tensor:
    """(I, J): per pair of heads min over orthogonal M of ||xA_i - M xB_j||^2 + ||yA_i - M yB_j||^2 on the
    pass-through dims, ||xA||^2 + ||yA||^2 + ||xB||^2 + ||yB||^2 - 2 (the moments' nuclear norm)."""
    squares = lambda x, y: x.double().pow(2).sum((1, 2)) + y.double().pow(2).sum((1, 2))  # noqa: E731
    moments = passthrough_moments(xa, ya, xb, yb)
    nuclear = (polar_factors(moments) * moments).sum((-1, -2))  # <U V^T, M> = the sum of M's singular values
    return squares(xa, ya)[:, None] + squares(xb, yb)[None] - 2 * nuclear


def passthrough_maps(xa: Tensor, ya: Tensor, xb: Tensor, yb: Tensor) -> Tensor:
    """Per head (K, p, p) the orthogonal M minimising ||xA - M xB||^2 + ||yA - M yB||^2 on the pass-through
    dims of a partial rotary head: queries get M and keys M^-T = M (orthogonal Procrustes, the polar factor
    of the moments), float64."""
    xa, ya, xb, yb = (t.double() for t in (xa, ya, xb, yb))
    u, _, vh = decomposed(torch.linalg.svd, xa @ xb.transpose(1, 2) + ya @ yb.transpose(1, 2))
    return u @ vh


def rotary_scales(
    xa: Tensor,
    ya: Tensor,
    xb: Tensor,
    yb: Tensor,
    rescale: bool = True,
    rounds: int = 3,
    rotary_dims: int | None = None,
) -> RotaryScale:
    """Per group and pair the w moving B's query rows xb (K, d, n) and key rows yb (K, d, m) onto A's.
    `rotary_dims`: only the first r rows rotate (partial rotary); the rest get passthrough_maps."""
    r = xa.shape[1] if rotary_dims is None else rotary_dims
    za, zb, ua, ub = (as_complex(t[:, :r]) for t in (xa, xb, ya, yb))
    cz, cu = (za * zb.conj()).sum(-1), (ua * ub.conj()).sum(-1)
    P, Q = zb.abs().pow(2).sum(-1), ub.abs().pow(2).sum(-1)
    passthrough = None
    if r < xa.shape[1]:
        passthrough = passthrough_maps(*(t[:, r:] for t in (xa, ya, xb, yb))).float()
    return RotaryScale.from_complex(solve_pairs(cz, cu, P, Q, rescale, rounds).to(torch.complex64), passthrough)
