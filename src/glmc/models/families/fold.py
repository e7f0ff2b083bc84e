"""LayerNorm -> RMS norm folding, shared by the Hugging Face converters.

Centre every residual writer (so the stream has zero mean and LayerNorm's mean subtraction is a
no-op), then LN(x) = gamma * rms(x) + beta, and gamma, beta fold into the readers after the norm.
"""

from torch import Tensor


def center(t: Tensor, axis: int) -> Tensor:
    """Writer with its output along `axis` projected onto zero-mean vectors (M = I - 11^T/D)."""
    return t - t.mean(axis, keepdim=True)


def fold_norm(w: Tensor, b: Tensor | None, gamma: Tensor, beta: Tensor) -> tuple[Tensor, Tensor]:
    """Reader (out, D) after a LayerNorm: W (gamma * r + beta) + b = (W diag(gamma)) r + (b + W beta)."""
    bias = w @ beta if b is None else b + w @ beta
    return w * gamma, bias


def common_eps(norms) -> float:
    """The one eps shared by all LayerNorms (the canonical model has a single norm_eps)."""
    eps = {n.eps for n in norms}
    if len(eps) != 1:
        raise NotImplementedError(f"LayerNorms with different eps {sorted(eps)}")
    return eps.pop()
