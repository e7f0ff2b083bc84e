"""Norm-relative comparisons of float results computed two ways.

A float32 matmul or reduction is exact to about 1e-7 of the magnitude of the whole result, not of
each entry: an entry that nearly cancels carries an error far above its own size, and the error of
a large entry grows with the summed magnitudes. How large the error is also depends on the CPU's
vector instructions (AVX-512, AVX2 or none: ATEN_CPU_CAPABILITY), the BLAS kernel and the number of
threads, which change the order of the sums. So results are compared by the Frobenius norm of their
difference relative to the norm of the expected tensor, in float64:

    ||actual - expected|| <= rtol * max(||expected||, floor)

Tolerances, from float32 round-off (about 6e-8 per operation, growing with the depth of the chain):

    FEW_OPS  1e-5  a few matmuls or reductions computed two ways (Gram matrices, circuits, a map applied)
    FORWARD  1e-4  whole forward passes on a differently computed path (HF model against the canonical
                   form, transformed or re-stacked weights), and the quantities derived from them

A broken symmetry or a wrong formula gives relative errors of 1e-2 to 1, so both stay far below what
a real bug produces.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

FEW_OPS = 1e-5
FORWARD = 1e-4
TINY = 1e-30


def _float64(t) -> torch.Tensor:
    return torch.as_tensor(t).detach().to("cpu", torch.float64)


def relative_error(actual, expected, floor: float = 0.0, what: str = "") -> tuple[float, float]:
    """(||actual - expected|| / max(||expected||, floor), ||expected||), norms over the whole tensor in float64."""
    a, e = _float64(actual), _float64(expected)
    if a.shape != e.shape:
        label = f"{what}: " if what else ""
        raise AssertionError(f"{label}shapes differ: actual {tuple(a.shape)}, expected {tuple(e.shape)}")
    norm = float(torch.linalg.vector_norm(e))
    diff = float(torch.linalg.vector_norm(a - e))
    if not math.isfinite(diff):
        return math.inf, norm
    return diff / max(norm, floor, TINY), norm


def assert_close_rel(actual, expected, rtol: float, what: str = "", floor: float = 0.0) -> float:
    """Assert ||actual - expected|| <= rtol * max(||expected||, floor); returns the relative error.

    `floor` is the smallest magnitude the error is measured against, for an expected tensor that is
    zero or nearly so (an unused bias); without it such a tensor must be matched exactly."""
    error, norm = relative_error(actual, expected, floor, what)
    if not error <= rtol:
        label = f"{what}: " if what else ""
        raise AssertionError(
            f"{label}relative error {error:.3e} > rtol {rtol:.1e} (||expected|| = {norm:.4g}"
            f"{f', floor {floor:.3g}' if floor else ''}, shape {tuple(torch.as_tensor(expected).shape)})"
        )
    return error


def assert_params_close_rel(
    actual: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor], rtol: float, what: str = ""
) -> None:
    """Every tensor of `expected` against the one of the same name in `actual`, relative to its own
    norm; a tensor smaller than the rest (a zero bias) is measured against the norm a tensor of its
    size would have at the root mean square of all the parameters."""
    assert actual.keys() == expected.keys(), f"{what}: names differ: {sorted(actual.keys() ^ expected.keys())}"
    squares = sum(float(_float64(t).pow(2).sum()) for t in expected.values())
    count = sum(torch.as_tensor(t).numel() for t in expected.values())
    rms = math.sqrt(squares / max(count, 1))
    for name, want in expected.items():
        floor = rms * math.sqrt(torch.as_tensor(want).numel())
        assert_close_rel(actual[name], want, rtol, f"{what} {name}".strip(), floor=floor)
