from __future__ import annotations

import pytest
import torch

from glmc.eval.barrier import barrier, barrier_vs_mean, lambda_grid
from glmc.interpolation import interpolate, interpolate_state_dicts

from numeric import FEW_OPS, assert_close_rel


def test_lambda_grid_has_endpoints_and_step():
    grid = lambda_grid(11)
    assert grid[0] == 0.0 and grid[-1] == 1.0 and grid[1] == pytest.approx(0.1)
    with pytest.raises(ValueError, match="num_lambdas"):
        lambda_grid(1)


def test_barrier_against_linear_baseline():
    lambdas = [0.0, 0.5, 1.0]
    # B (lam=0) has loss 1, A (lam=1) has loss 3: the baseline at 0.5 is 2, the path reaches 5.
    assert barrier(lambdas, [1.0, 5.0, 3.0]) == pytest.approx(3.0)
    assert barrier_vs_mean(lambdas, [1.0, 5.0, 3.0]) == pytest.approx(3.0)
    # A convex path lies below the baseline: no barrier (the endpoints give exactly 0).
    assert barrier(lambdas, [1.0, 0.5, 3.0]) == pytest.approx(0.0)
    # The plain-mean variant differs when the maximum is not in the middle.
    assert barrier([0.0, 0.25, 1.0], [1.0, 4.0, 3.0]) == pytest.approx(4.0 - 1.5)
    assert barrier_vs_mean([0.0, 0.25, 1.0], [1.0, 4.0, 3.0]) == pytest.approx(4.0 - 2.0)


@pytest.mark.numeric
def test_interpolation_is_affine_and_checks_shapes():
    a, b = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    mid = interpolate([a, b], [0.25, 0.75])
    assert_close_rel(mid.weight, 0.25 * a.weight + 0.75 * b.weight, FEW_OPS, "interpolated weight")
    with pytest.raises(ValueError, match="weight"):
        interpolate_state_dicts([a.state_dict(), torch.nn.Linear(4, 2).state_dict()], [0.5, 0.5])
