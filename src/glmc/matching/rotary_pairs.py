"""Closed-form rotation-scaling of rotary query/key pairs (the qk group of Llama-style models).

Under rotary positions a key/value group's query/key space admits, per frequency pair (i, i + d/2),
only multiplication by a complex number w = s e^{i phi} (glmc.symmetry.groups.RotaryScale): queries
get w, keys 1/conj(w). Writing a pair's rows as complex vectors z = x_i + i x_{i+d/2}, matching B to A
minimises per pair

    sum |zA - w zB|^2 + sum |uA - uB / conj(w)|^2        (z: query rows, u: key rows)
    = s^2 P - 2 s Re(e^{-i phi} cz) + Q / s^2 - 2 Re(e^{-i phi} cu) / s + const,

with cz = sum zA conj(zB), cu = sum uA conj(uB), P = sum |zB|^2, Q = sum |uB|^2. For a fixed s the
best phi is arg(s cz + cu / s), a one-dimensional Procrustes problem (paper 002's rotation, per
pair); for a fixed phi, s solves paper 002's quartic (glmc.matching.scales). Starting from s = 1
and alternating never increases the objective.
"""

from __future__ import annotations

import torch
from torch import Tensor

from glmc.matching.scales import best_scales
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


def rotary_scales(xa: Tensor, ya: Tensor, xb: Tensor, yb: Tensor, rescale: bool = True, rounds: int = 3) -> RotaryScale:
    """Per group and pair the w moving B's query rows xb (K, d, n) and key rows yb (K, d, m) onto A's."""
    za, zb, ua, ub = (as_complex(t) for t in (xa, xb, ya, yb))
    cz, cu = (za * zb.conj()).sum(-1), (ua * ub.conj()).sum(-1)
    P, Q = zb.abs().pow(2).sum(-1), ub.abs().pow(2).sum(-1)
    return RotaryScale.from_complex(solve_pairs(cz, cu, P, Q, rescale, rounds).to(torch.complex64))
