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
