"""The best positive rescaling of a writer against its reader, for many units at once.

A unit written by X (it gets a) and read by Y (it gets 1/a) is matched to A's by minimising over a > 0

    ||X_A - a X_B||^2 + ||Y_A - Y_B / a||^2 = a^2 P - 2 a p + Q / a^2 - 2 q / a + const,

with P = |X_B|^2, p = <X_A, X_B>, Q = |Y_B|^2, q = <Y_A, Y_B> (after any rotation already applied to B).
Setting the derivative to zero gives P a^4 - p a^3 + q a - Q = 0 (paper 002 Eq. 11-12): its positive
real roots, and a = 1, are the candidates, and the one of least objective is taken.
"""

from __future__ import annotations

import torch
from torch import Tensor

from glmc.matching.engine.projections import decomposed


def scale_objective(a: Tensor, P: Tensor, p: Tensor, Q: Tensor, q: Tensor) -> Tensor:
    return a * a * P - 2 * a * p + Q / (a * a) - 2 * q / a


def best_scales(P: Tensor, p: Tensor, Q: Tensor, q: Tensor) -> Tensor:
    """argmin over a > 0 per element, float64, same shape as the inputs; 1 where P or Q is zero (the
    objective does not bound a there)."""
    P, p, Q, q = (t.double().flatten() for t in (P, p, Q, q))
    valid = (P > 0) & (Q > 0)
    safe = torch.where(valid, P, torch.ones_like(P))
    # companion matrix of a^4 - (p/P) a^3 + (q/P) a - Q/P
    companion = torch.zeros(len(P), 4, 4, dtype=torch.float64, device=P.device)
    companion[:, 0, 0] = p / safe
    companion[:, 0, 2] = -q / safe
    companion[:, 0, 3] = Q / safe
    companion[:, 1, 0] = companion[:, 2, 1] = companion[:, 3, 2] = 1.0
    # (a device has no general eigensolver of its own: its eigvals takes each 4 x 4 matrix to the host alone)
    roots = decomposed(torch.linalg.eigvals, companion)
    real = roots.real.clamp_min(1e-12)
    usable = (roots.imag.abs() <= 1e-8 * roots.abs().clamp_min(1.0)) & (roots.real > 0)
    candidates = torch.cat([torch.ones(len(P), 1, dtype=torch.float64, device=P.device), real], 1)
    usable = torch.cat([torch.ones(len(P), 1, dtype=torch.bool, device=P.device), usable], 1)
    values = scale_objective(candidates, *(t[:, None] for t in (P, p, Q, q)))
    values = torch.where(usable, values, torch.full_like(values, float("inf")))
    best = candidates.gather(1, values.argmin(1, keepdim=True))[:, 0]
    return torch.where(valid, best, torch.ones_like(best))
