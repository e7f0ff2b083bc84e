"""Rotary position embeddings in the rotate-half layout (Hugging Face Llama, Mistral, Qwen2).

A head vector of size d is split into pairs (i, i + d/2); at position t, pair i is rotated by the angle
t * f_i with f_i = theta^(-2i/d). A score q^T k then depends on the positions only through their
difference. The maps of a head's query space that commute with every position's rotation are, per
pair, a rotation-scaling [[a, -b], [b, a]] (multiplication by the complex number a + ib): glmc's
`rotary_scale` group (glmc.symmetry.groups.RotaryScale). A general invertible map does not commute, so
the query/key circuit W_q^T W_k is not what a rotary model computes, and its qk space admits only this
group. What it computes per head is q^T R_{s-t} k; a weighted sum of such forms over models is a head
whose rows stack the models' heads, each block rotated as its own (apply_rotary's head_dim): that is how
rotary heads are interpolated as circuits.
"""

from __future__ import annotations

import torch
from torch import Tensor


def inverse_frequencies(head_dim: int, theta: float, dtype: torch.dtype = torch.float32) -> Tensor:
    """f_i = theta^(-2i/d) for the d/2 pairs (computed in float32 as Hugging Face does, unless float64)."""
    if head_dim % 2:
        raise ValueError(f"rotary embeddings need an even head dimension, got {head_dim}")
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=dtype) / head_dim))


def rotate_half(x: Tensor) -> Tensor:
    """(x1, x2) -> (-x2, x1) on the two halves of the last axis."""
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rotary(x: Tensor, theta: float, head_dim: int | None = None) -> Tensor:
    """Rotate (..., T, d) head vectors by their positions 0 .. T-1. With `head_dim` < d, the vector holds
    d / head_dim heads stacked (circuit interpolation, glmc.interpolation) and each is rotated as its own."""
    if head_dim is not None and head_dim != x.shape[-1]:
        blocks = x.unflatten(-1, (-1, head_dim)).transpose(-2, -3)  # (..., n, T, head_dim)
        return apply_rotary(blocks, theta).transpose(-2, -3).flatten(-2)
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    positions = torch.arange(x.shape[-2], device=x.device, dtype=dtype)
    freqs = positions[:, None] * inverse_frequencies(x.shape[-1], theta, dtype).to(x.device)[None]
    angles = torch.cat([freqs, freqs], dim=-1)
    return x * angles.cos().to(x.dtype) + rotate_half(x) * angles.sin().to(x.dtype)
