"""Loss barriers along a linear path theta(lam) = lam*theta_A + (1-lam)*theta_B."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def lambda_grid(num: int) -> list[float]:
    if num < 2:
        raise ValueError(f"eval.num_lambdas={num}: need at least the two endpoints")
    return [round(float(x), 10) for x in np.linspace(0.0, 1.0, num)]


def barrier(lambdas: Sequence[float], losses: Sequence[float]) -> float:
    """Paper 001 Eq. 1: max over lam of L(theta_lam) - (lam L(theta_A) + (1-lam) L(theta_B)).

    lam = 1 is model A and lam = 0 is model B, read from the curve itself."""
    lam, loss = np.asarray(lambdas, float), np.asarray(losses, float)
    loss_a, loss_b = loss[np.argmax(lam)], loss[np.argmin(lam)]
    return float(np.max(loss - (lam * loss_a + (1 - lam) * loss_b)))


def barrier_vs_mean(lambdas: Sequence[float], losses: Sequence[float]) -> float:
    """Paper 003's variant: the highest loss on the path minus the plain mean of the endpoint losses."""
    lam, loss = np.asarray(lambdas, float), np.asarray(losses, float)
    return float(np.max(loss) - 0.5 * (loss[np.argmax(lam)] + loss[np.argmin(lam)]))


# a path's ends are the endpoints: their losses agree to float32 round-off, or the path computes something else
END_RTOL = 1e-4


def path_end_mismatches(
    lambdas: Sequence[float], losses: Sequence[float], loss_a: float, loss_b: float, rtol: float = END_RTOL
) -> list[str]:
    """'lambda=1 (model A): path 2.3, endpoint 2.2' for each end whose loss is off its endpoint's by > rtol."""
    ends = {1.0: ("model A", loss_a), 0.0: ("model B", loss_b)}
    out = []
    for lam, loss in zip(lambdas, losses):
        if lam in ends and loss is not None:
            name, own = ends[lam]
            if abs(loss - own) > max(rtol * abs(own), 1e-6):
                out.append(f"lambda={lam:g} ({name}): path {loss:.6g}, endpoint {own:.6g}")
    return out
