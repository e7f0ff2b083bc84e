"""Latent matrices -> group elements, inside the autograd graph (paper 001 §4.2 and Appendix D).

straight_through_permutation  forward: the Hungarian projection P; backward: as if P were the latent
polar                         forward: U V^T of the latent's SVD; backward: the exact polar derivative
sinkhorn                      exp(Z / tau) made doubly stochastic by alternating normalisations
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import Tensor

from glmc.symmetry import Permutation
from glmc.threads import RESAMPLE_AFTER, busy_cores, choose_threads, one_thread, usable_cores


def straight_through_permutation(latent: Tensor, perm: Tensor | None = None) -> Tensor:
    """Hard permutation matrix whose gradient flows to the latent unchanged (Bengio et al. 2013); `perm`:
    the latent's projection where the caller solved it already (else Permutation.project, on the host)."""
    projected = Permutation.project(latent) if perm is None else Permutation(perm)
    hard = projected.dense(latent.dtype).to(latent.device)
    # (latent - latent.detach()) is exactly zero, so the forward value is exactly the permutation
    return hard + (latent - latent.detach())


class _Polar(torch.autograd.Function):
    """U V^T with the closed-form gradient, which divides by sigma_i + sigma_j where the SVD's divides by
    sigma_i^2 - sigma_j^2 (exploding at an orthogonal start): with M = U^T G V,
    U [(M - M^T) / (sigma_i + sigma_j)] V^T + (I - U U^T) G V diag(1/sigma) V^T (last term: tall only)."""

    @staticmethod
    def forward(ctx, a: Tensor) -> Tensor:
        u, s, vh = _svd_factors(a)
        ctx.save_for_backward(u, s, vh)
        return u @ vh

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        u, s, vh = ctx.saved_tensors
        m = u.mT @ grad @ vh.mT
        out = u @ ((m - m.mT) / (s[:, None] + s[None, :])) @ vh
        if u.shape[0] > u.shape[1]:
            out = out + (grad - u @ (u.mT @ grad)) @ (vh.mT / s) @ vh
        return out


# eigh of A^T A squares A's condition number: used while the eigenvalues' ratio stays above these
GRAM_CONDITION = {torch.float32: 1e-4, torch.float64: 1e-8}


def _svd_factors(a: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """U, sigma, V^T of a (m >= n), from the eigendecomposition of A^T A where A is well
    conditioned (two to three times faster than the SVD on CPU), else from torch.linalg.svd."""
    return _factors(a, True)[:3]


def _factors(a: Tensor, try_gram: bool) -> tuple[Tensor, Tensor, Tensor, bool]:
    """_svd_factors, the Gram matrix tried only with `try_gram`, and whether it served."""
    gram = a.mT @ a if try_gram and a.shape[-2] >= a.shape[-1] else None
    # entries beyond sqrt(float max) overflow the Gram matrix: the SVD alone sees what they are
    if gram is not None and bool(torch.isfinite(gram).all()):
        try:
            values, v = decomposed(torch.linalg.eigh, gram)
        except torch.linalg.LinAlgError:  # let the SVD decide whether the latent can be projected
            return *_svd(a), False
        if bool(values.min() > GRAM_CONDITION.get(a.dtype, 1e-4) * values.max()):
            s = values.sqrt()
            return (a @ v) / s, s, v.mT, True
    return *_svd(a), False


def _svd(a: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    return decomposed(torch.linalg.svd, a, full_matrices=False)


# from this many columns a decomposition on the host keeps torch's threads while no other process keeps a
# core busy (on 2 cores a 2,048-wide SVD took 3.3 s on two threads, 4.6 s on one, 18 to 36 s on two beside
# a busy process); narrower ones gain little from threads (768 wide: 0.11 s on one)
THREADED_FROM = 1024
_FREE: list[tuple[float, int]] = []  # (when sampled, threads the cores not taken allow)


# a CUDA device's solvers take a batch of small matrices one matrix at a time, each a launch and a wait
# (the general eigensolver even goes through the host per matrix: about a millisecond each), so that on an
# H100 the rescalings' quartics and per-head SVDs of a Pythia-410M pair held two weight-matching iterations
# past 100 s: narrower matrices than this are decomposed on the host, where the whole batch takes milliseconds
ON_HOST_BELOW = 256
# a host batch of at least this many narrow matrices is split between the cores no other process takes, one
# part per thread (LAPACK decomposes each matrix alone, without the GIL: the same floats); a Pythia-160M
# search's heads take about a second per iteration in 64 x 64 eigensolvers on one core
SPLIT_FROM = 32


def decomposed(decomposition: Callable[..., Any], a: Tensor, **kwargs) -> Any:
    """decomposition(a, **kwargs) (a torch.linalg function) in the context decompositions run in; where `a`
    lives on a CUDA device and its matrices are narrower than ON_HOST_BELOW, on the host, the results
    handed back on `a`'s device (a tensor, or a tuple of them)."""
    if a.device.type != "cuda" or a.shape[-1] >= ON_HOST_BELOW:
        return _on_host(decomposition, a, kwargs)
    out = _on_host(decomposition, a.cpu(), kwargs)
    if isinstance(out, Tensor):
        return out.to(a.device)
    return tuple(t.to(a.device) for t in out)


def _on_host(decomposition: Callable[..., Any], a: Tensor, kwargs: dict[str, Any]) -> Any:
    """decomposition(a) in its context; a large batch of narrow host matrices in parts side by side."""
    parts = _parts(a)
    if parts <= 1:
        with decomposing(a):
            return decomposition(a, **kwargs)
    flat = a.reshape(-1, *a.shape[-2:])
    with one_thread(), ThreadPoolExecutor(parts) as pool:
        outs = list(pool.map(lambda part: decomposition(part, **kwargs), flat.tensor_split(parts)))
    joined = lambda pieces: torch.cat(pieces).reshape(*a.shape[:-2], *pieces[0].shape[1:])  # noqa: E731
    if isinstance(outs[0], Tensor):
        return joined(outs)
    return tuple(joined([out[i] for out in outs]) for i in range(len(outs[0])))


def _parts(a: Tensor) -> int:
    """How many parts a host batch is decomposed in side by side (1: as it is)."""
    if a.device.type != "cpu" or a.dim() < 3 or a.shape[-1] >= THREADED_FROM:
        return 1
    batch = a.shape[:-2].numel()
    if batch < SPLIT_FROM or torch.get_num_threads() <= 1:  # (inside one_thread: already side by side)
        return 1
    return min(free_threads(), torch.get_num_threads(), batch // (SPLIT_FROM // 2))


def decomposing(a: Tensor) -> AbstractContextManager:
    """The context a decomposition of `a` runs in: on the host one thread (LAPACK's threads wait on each
    other at every stage, and beside a busy process for a core), but torch's own where `a` is at least
    THREADED_FROM wide and no core is taken; unchanged on a device."""
    if a.device.type != "cpu":
        return nullcontext()
    if a.shape[-1] >= THREADED_FROM and torch.get_num_threads() > 1 and free_threads() > 1:
        return nullcontext()
    return one_thread()


def free_threads() -> int:
    """Threads for the cores no other process keeps busy (glmc.threads.choose_threads), sampled at most
    every RESAMPLE_AFTER seconds."""
    now = time.monotonic()
    if not _FREE or now - _FREE[0][0] > RESAMPLE_AFTER:
        cores = usable_cores()
        _FREE[:] = [(now, choose_threads(len(cores), busy_cores(cores)))]
    return _FREE[0][1]


def polar_factor(a: Tensor, try_gram: bool = True) -> tuple[Tensor, bool]:
    """(the polar factor of a, whether the Gram matrix served), outside autograd: a caller that
    projects similar matrices again and again skips the Gram attempt once it has failed."""
    u, _, vh, gram = _factors(a, try_gram)
    return u @ vh, gram


def polar_factors(a: Tensor) -> Tensor:
    """The polar factor U V^T of every matrix of a batch (..., m, n), m >= n: from its Gram matrix's
    eigenvectors where that matrix is well conditioned (GRAM_CONDITION), by the SVD for the others (the
    eigensolver takes about 60 % of the SVD's time on 64 x 64 blocks)."""
    flat = a.reshape(-1, *a.shape[-2:])
    try:
        values, v = decomposed(torch.linalg.eigh, flat.mT @ flat)  # ascending
    except torch.linalg.LinAlgError:  # the SVD says what is wrong with the matrices
        values, v = None, None
    if values is None:
        bad = torch.arange(len(flat), device=a.device)
        factors = torch.empty_like(flat)
    else:
        well = values[:, 0] > GRAM_CONDITION.get(a.dtype, 1e-4) * values[:, -1]  # (NaN: not well)
        factors = (flat @ v / values.clamp_min(torch.finfo(values.dtype).tiny).sqrt()[:, None, :]) @ v.mT
        bad = (~well).nonzero().squeeze(1)
    if len(bad):
        u, _, vh = decomposed(torch.linalg.svd, flat.index_select(0, bad), full_matrices=False)
        factors[bad] = u @ vh
    return factors.reshape(a.shape)


def polar(latent: Tensor) -> Tensor:
    """Nearest matrix with orthonormal columns (as Orthogonal.project), differentiable."""
    return _Polar.apply(latent)


def sinkhorn(z: Tensor, iters: int, temperature: float = 1.0) -> Tensor:
    """Doubly stochastic matrix from exp(z / temperature): rows, then columns, normalised `iters` times,
    in the log domain (no underflow or NaN gradients)."""
    log_p = z / temperature
    for _ in range(iters):
        log_p = log_p - log_p.logsumexp(-1, keepdim=True)
        log_p = log_p - log_p.logsumexp(-2, keepdim=True)
    return log_p.exp()


def sinkhorn_latent(p: Tensor, noise: float, temperature: float = 1.0, generator=None) -> Tensor:
    """Z with exp(Z / tau) = P + noise, the noise |N(0, 1)| sqrt(2 / (n + m)) `noise` (Appendix D) plus a
    floor that keeps the logarithm finite."""
    n, m = p.shape
    eps = torch.randn(p.shape, generator=generator, dtype=torch.float64).abs()
    target = p.double() + noise * math.sqrt(2.0 / (n + m)) * eps + 1e-12
    return (temperature * target.log()).to(p.dtype)
