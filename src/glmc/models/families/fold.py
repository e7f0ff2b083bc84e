"""LayerNorm -> RMS norm folding: every residual writer is centred (the mean subtraction is then a no-op),
so LN(x) = gamma * rms(x) + beta, and gamma, beta fold into the readers after the norm.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn


class StoredAs(dict):
    """A converter's canonical tensors, each cast to the model's dtype (contiguous) as it is written: the
    folding runs in float64 a layer at a time, never the whole model (a 1B model would be 8 GB at once)."""

    def __init__(self, dtype: torch.dtype, tensors: dict[str, Tensor] | None = None):
        super().__init__()
        self.dtype = dtype
        self.update(tensors or {})

    def __setitem__(self, name: str, t: Tensor) -> None:
        super().__setitem__(name, t.to(self.dtype).contiguous())

    def update(self, tensors: dict[str, Tensor]) -> None:
        for name, t in tensors.items():
            self[name] = t

    def __ior__(self, tensors: dict[str, Tensor]) -> StoredAs:
        self.update(tensors)
        return self


ROWS_AT_A_TIME = 1 << 22  # elements of a vocabulary-sized matrix folded in float64 at a time


def by_rows(fold: Callable[[Tensor], Tensor], t: Tensor, dtype: torch.dtype) -> Tensor:
    """fold(t) for a fold that treats each row alone (centring it, scaling its columns, its product with a
    vector), on float64 rows a chunk at a time, each cast to `dtype`: an embedding or a language head over
    a large vocabulary is never held whole in float64."""
    rows = max(1, ROWS_AT_A_TIME // max(1, t[0].numel()))
    first = fold(t[:rows].detach().double()).to(dtype)
    out = first.new_empty((len(t), *first.shape[1:]))  # each chunk written into place, never held twice
    out[: len(first)] = first
    for i in range(rows, len(t), rows):
        out[i : i + rows] = fold(t[i : i + rows].detach().double())
    return out


def center(t: Tensor, axis: int) -> Tensor:
    """Writer with its output along `axis` projected onto zero-mean vectors (M = I - 11^T/D)."""
    return t - t.mean(axis, keepdim=True)


def fold_norm(w: Tensor, b: Tensor | None, gamma: Tensor, beta: Tensor) -> tuple[Tensor, Tensor]:
    """Reader (out, D) after a LayerNorm: W (gamma * r + beta) + b = (W diag(gamma)) r + (b + W beta)."""
    bias = w @ beta if b is None else b + w @ beta
    return w * gamma, bias


def weights64(module: nn.Module) -> tuple[Tensor, Tensor]:
    """(weight, bias) of a Linear or LayerNorm, detached, in float64."""
    return module.weight.detach().double(), module.bias.detach().double()


def fold_block(pre: str, heads: int, norm1, qkv, o, norm2, mlp_in, mlp_out) -> dict[str, Tensor]:
    """One pre-LN block's canonical tensors from float64 (weight, bias) pairs in nn.Linear layout: norm1's
    (gamma, beta) folded into q, k, v ((weight, bias, attention scale) each), norm2's into mlp_in; the
    writers o and mlp_out centred."""
    p = {}
    for name, (w, b, scale) in zip("qkv", qkv):
        w, b = fold_norm(w, b, *norm1)
        p[pre + name + "_w"] = (scale * w).reshape(heads, -1, w.shape[1])
        p[pre + name + "_b"] = (scale * b).reshape(heads, -1)
    p[pre + "o_w"] = center(o[0], 0).reshape(o[0].shape[0], heads, -1).permute(1, 0, 2)
    p[pre + "o_b"] = center(o[1], 0)
    p[pre + "in_w"], p[pre + "in_b"] = fold_norm(*mlp_in, *norm2)
    p[pre + "out_w"] = center(mlp_out[0], 0)
    p[pre + "out_b"] = center(mlp_out[1], 0)
    return p


def bias64(linear: nn.Linear, size: int) -> Tensor:
    """A Linear's bias in float64, zeros of `size` where it has none."""
    if linear.bias is None:  # on the weights' device: a converted model lives on one device
        return torch.zeros(size, dtype=torch.float64, device=linear.weight.device)
    return linear.bias.detach().double()


def common_eps(norms) -> float:
    """The one eps shared by all LayerNorms (the canonical model has a single norm_eps)."""
    eps = {n.eps for n in norms}
    if len(eps) != 1:
        raise NotImplementedError(f"LayerNorms with different eps {sorted(eps)}")
    return eps.pop()
