"""Rotary position embeddings in the rotate-half layout (Hugging Face Llama, Mistral, Qwen2, GPT-NeoX).

A head vector of size d is split into pairs (i, i + d/2); at position t, pair i is rotated by the angle
t * f_i with f_i = theta^(-2i/d). A score q^T k then depends on the positions only through their
difference. The maps of a head's query space that commute with every position's rotation are, per
pair, a rotation-scaling [[a, -b], [b, a]] (multiplication by the complex number a + ib): glmc's
`rotary_scale` group (glmc.symmetry.groups.RotaryScale). A general invertible map does not commute, so
the query/key circuit W_q^T W_k is not what a rotary model computes, and its qk space admits only this
group. What it computes per head is q^T R_{s-t} k; a weighted sum of such forms over models is a head
whose rows stack the models' heads, each block rotated as its own (apply_rotary's head_dim): that is how
rotary heads are interpolated as circuits.

Partial rotary (GPT-NeoX, Pythia): only the first r dims of a head rotate, as pairs (i, i + r/2) with
f_i = theta^(-2i/r); the other d - r dims pass through, so a score is a rotary form on the first r
dims plus a plain bilinear form q_p^T k_p on the rest. A map of the query space survives when it is a
rotation-scaling per pair on the rotary dims and any invertible map on the pass-through dims (keys
getting its inverse transpose), never one mixing the two. Hugging Face's scaled rotary types (linear,
dynamic, yarn, llama3) change only the frequencies (and yarn multiplies cos and sin by a constant), so
the same maps survive them.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def inverse_frequencies(head_dim: int, theta: float, dtype: torch.dtype = torch.float32) -> Tensor:
    """f_i = theta^(-2i/d) for the d/2 pairs (computed in float32 as Hugging Face does, unless float64)."""
    if head_dim % 2:
        raise ValueError(f"rotary embeddings need an even head dimension, got {head_dim}")
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=dtype) / head_dim))


# Hugging Face's rope_type values whose frequencies rotary_frequencies computes
SCALED_TYPES = ("linear", "dynamic", "yarn", "llama3")


def rotary_frequencies(
    dim: int, theta: float, scaling: dict | None = None, length: int | None = None, dtype: torch.dtype = torch.float32
) -> tuple[Tensor, float]:
    """(the dim/2 inverse frequencies, the factor cos and sin are multiplied by) of a head's `dim` rotating
    dims under a rotary scaling: None (unscaled) or a dict holding `rope_type` and its parameters as in a
    Hugging Face config's rope_parameters (dynamic and yarn also `max_position_embeddings`). `length`: the
    sequence length, which dynamic scaling reads."""
    kind = "default" if scaling is None else scaling["rope_type"]
    if kind == "default":
        return inverse_frequencies(dim, theta, dtype), 1.0
    if kind == "linear":  # positions divided by the factor
        return inverse_frequencies(dim, theta, dtype) / scaling["factor"], 1.0
    if kind == "dynamic":
        return _dynamic(dim, theta, scaling, length, dtype), 1.0
    if kind == "llama3":
        return _llama3(dim, theta, scaling, dtype), 1.0
    if kind == "yarn":
        return _yarn(dim, theta, scaling, dtype)
    raise NotImplementedError(f"rotary scaling of type {kind!r}; known: default, {', '.join(SCALED_TYPES)}")


def _dynamic(dim: int, theta: float, scaling: dict, length: int | None, dtype: torch.dtype) -> Tensor:
    """Dynamic NTK scaling: beyond the original maximum length the base grows with the sequence length.
    Computed from the length of each forward; Hugging Face keeps the frequencies of the longest sequence
    it has seen (until one shorter than the original maximum), so the two agree on a fresh model or on
    lengths that only grow."""
    original, factor = scaling["max_position_embeddings"], scaling["factor"]
    if length is None or length <= original:
        return inverse_frequencies(dim, theta, dtype)
    if dim <= 2:
        raise ValueError(f"dynamic rotary scaling needs more than 2 rotating dims, got {dim}")
    base = theta * (factor * length / original - (factor - 1)) ** (dim / (dim - 2))
    return inverse_frequencies(dim, base, dtype)


def _llama3(dim: int, theta: float, scaling: dict, dtype: torch.dtype) -> Tensor:
    """Llama 3.1's scaling: wavelengths beyond original / low_freq_factor slowed by the factor, those below
    original / high_freq_factor kept, and a linear blend of the two in between."""
    f = inverse_frequencies(dim, theta, dtype)
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    original = scaling["original_max_position_embeddings"]
    wavelength = 2 * math.pi / f
    slowed = torch.where(wavelength > original / low, f / factor, f)
    blend = (original / wavelength - low) / (high - low)
    between = (wavelength >= original / high) & (wavelength <= original / low)
    return torch.where(between, (1 - blend) * f / factor + blend * f, slowed)


def _yarn_attention_factor(scaling: dict, factor: float) -> float:
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])

    def grow(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    mscale, mscale_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
    if mscale and mscale_all:
        return grow(factor, mscale) / grow(factor, mscale_all)
    return grow(factor)


def _yarn(dim: int, theta: float, scaling: dict, dtype: torch.dtype) -> tuple[Tensor, float]:
    """YaRN: per pair a blend of the original frequency (fast pairs, many turns within the original length)
    and the interpolated one (slow pairs), ramping between beta_fast and beta_slow turns; cos and sin
    grow by the attention factor."""
    original = scaling["original_max_position_embeddings"]
    factor = scaling.get("factor") or scaling["max_position_embeddings"] / original
    fast, slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def pair_of(turns: float) -> float:  # the (fractional) pair index that makes `turns` turns in `original`
        return dim * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(theta))

    low, high = pair_of(fast), pair_of(slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1).to(dtype)
    f = inverse_frequencies(dim, theta, dtype)
    return f / factor * ramp + f * (1 - ramp), _yarn_attention_factor(scaling, factor)


def rotate_half(x: Tensor) -> Tensor:
    """(x1, x2) -> (-x2, x1) on the two halves of the last axis."""
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rotary(
    x: Tensor,
    theta: float,
    head_dim: int | None = None,
    rotary_dims: int | None = None,
    scaling: dict | None = None,
) -> Tensor:
    """Rotate (..., T, d) head vectors by their positions 0 .. T-1. With `head_dim` < d, the vector holds
    d / head_dim heads stacked (circuit interpolation, glmc.interpolation) and each is rotated as its own.
    `rotary_dims`: only the first r dims of each head rotate, as pairs (i, i + r/2), the rest pass
    through (GPT-NeoX's partial rotary); `scaling`: rotary_frequencies' scaling."""
    if head_dim is not None and head_dim != x.shape[-1]:
        blocks = x.unflatten(-1, (-1, head_dim)).transpose(-2, -3)  # (..., n, T, head_dim)
        return apply_rotary(blocks, theta, None, rotary_dims, scaling).transpose(-2, -3).flatten(-2)
    if rotary_dims is not None and rotary_dims != x.shape[-1]:
        rotated = apply_rotary(x[..., :rotary_dims], theta, scaling=scaling)
        return torch.cat([rotated, x[..., rotary_dims:]], dim=-1)
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    positions = torch.arange(x.shape[-2], device=x.device, dtype=dtype)
    inverse, factor = rotary_frequencies(x.shape[-1], theta, scaling, x.shape[-2], dtype)
    freqs = positions[:, None] * inverse.to(x.device)[None]
    angles = torch.cat([freqs, freqs], dim=-1)
    cos, sin = angles.cos(), angles.sin()
    if factor != 1.0:  # yarn: both q and k, so scores grow by factor^2
        cos, sin = cos * factor, sin * factor
    return x * cos.to(x.dtype) + rotate_half(x) * sin.to(x.dtype)
