"""Rotary position embeddings in the rotate-half layout (Hugging Face Llama, Mistral, Qwen2, GPT-NeoX).

Pair (i, i + d/2) of a head is rotated at position t by t * theta^(-2i/d). The maps of a head's query
space that commute with every rotation are a rotation-scaling per pair (glmc.symmetry.groups.RotaryScale),
so W_q^T W_k is not what a rotary head computes; rotary heads interpolate as stacked circuits, each block
rotated as its own (apply_rotary's head_dim). Partial rotary (GPT-NeoX) rotates only the first r dims; an
odd Hugging Face count n rotates n + 1 dims at n's frequencies (`rotating_dims`). Scaled rotary types
change only the frequencies (yarn also scales cos and sin), so the same maps survive them.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def inverse_frequencies(head_dim: int, theta: float, dtype: torch.dtype = torch.float32) -> Tensor:
    """f_i = theta^(-2i/d) for i < ceil(d/2), in float32 as Hugging Face computes them (unless float64)."""
    if head_dim < 1:
        raise ValueError(f"rotary embeddings need at least one dimension, got {head_dim}")
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=dtype) / head_dim))


def rotating_dims(hf_dims: int) -> int:
    """The dims Hugging Face rotates for `hf_dims` = int(head_dim * partial_rotary_factor): one more if odd."""
    return hf_dims + hf_dims % 2


# scaled types whose frequencies are a function of each unscaled frequency alone
ELEMENTWISE_TYPES = ("linear", "llama3")


def same_frequency_pairs(pairs: int, freq_dim: int, to_pairs: int, to_freq_dim: int, scaling: dict | None) -> list[int]:
    """For each of `pairs` pairs at theta^(-2i/freq_dim), the index j < to_pairs of the pair at
    theta^(-2j/to_freq_dim) turning at the same frequency (j = i * to_freq_dim / freq_dim); ValueError
    naming a pair without one."""
    if freq_dim == to_freq_dim and pairs <= to_pairs:
        return list(range(pairs))
    kind = None if scaling is None else scaling.get("rope_type")
    if kind not in (None, "default", *ELEMENTWISE_TYPES):
        raise ValueError(
            f"rotary scaling {kind!r} computes its frequencies from the count of rotary dims ({freq_dim} here, "
            f"{to_freq_dim} there): no pair of the one has the other's frequencies"
        )
    out = []
    for i in range(pairs):
        j, rest = divmod(i * to_freq_dim, freq_dim)
        if rest or j >= to_pairs:
            raise ValueError(
                f"rotary pair {i} turns at theta^(-{2 * i}/{freq_dim}), which no pair of a head rotating at "
                f"theta^(-2j/{to_freq_dim}) (j < {to_pairs}) does: the frequencies match only where "
                f"{to_freq_dim} is a multiple of {freq_dim}"
            )
        out.append(j)
    return out


# Hugging Face's rope_type values whose frequencies rotary_frequencies computes
SCALED_TYPES = ("linear", "dynamic", "yarn", "llama3")


def rotary_frequencies(
    dim: int, theta: float, scaling: dict | None = None, length: int | None = None, dtype: torch.dtype = torch.float32
) -> tuple[Tensor, float]:
    """(the dim/2 inverse frequencies, the factor for cos and sin) under `scaling`: None or a dict of
    `rope_type` and its parameters as in a Hugging Face config; `length`: what dynamic scaling reads."""
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
    """Dynamic NTK scaling: beyond the original maximum length the base grows with each forward's length."""
    original, factor = scaling["max_position_embeddings"], scaling["factor"]
    if length is None or length <= original:
        return inverse_frequencies(dim, theta, dtype)
    if dim <= 2:
        raise ValueError(f"dynamic rotary scaling needs more than 2 rotating dims, got {dim}")
    base = theta * (factor * length / original - (factor - 1)) ** (dim / (dim - 2))
    return inverse_frequencies(dim, base, dtype)


def _llama3(dim: int, theta: float, scaling: dict, dtype: torch.dtype) -> Tensor:
    """Llama 3.1's scaling: long wavelengths slowed by the factor, short ones kept, a blend in between."""
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
    """YaRN: per pair a blend of the original (fast pairs) and interpolated (slow pairs) frequency; cos and
    sin grow by the attention factor."""
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
    freq_dim: int | None = None,
) -> Tensor:
    """Rotate (..., T, d) head vectors by their positions 0 .. T-1; `head_dim` < d: stacked heads, each
    rotated as its own; `rotary_dims`: only the first r dims of each head rotate; `freq_dim`: the n of the
    frequencies theta^(-2i/n) where it is not r."""
    if head_dim is not None and head_dim != x.shape[-1]:
        blocks = x.unflatten(-1, (-1, head_dim)).transpose(-2, -3)  # (..., n, T, head_dim)
        return apply_rotary(blocks, theta, None, rotary_dims, scaling, freq_dim).transpose(-2, -3).flatten(-2)
    if rotary_dims is not None and rotary_dims != x.shape[-1]:
        rotated = apply_rotary(x[..., :rotary_dims], theta, scaling=scaling, freq_dim=freq_dim)
        return torch.cat([rotated, x[..., rotary_dims:]], dim=-1)
    d = x.shape[-1]
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    positions = torch.arange(x.shape[-2], device=x.device, dtype=dtype)
    inverse, factor = rotary_frequencies(d if freq_dim is None else freq_dim, theta, scaling, x.shape[-2], dtype)
    if 2 * inverse.numel() != d:  # each frequency turns one pair (i, i + d/2)
        raise ValueError(
            f"{d} rotating dims cannot hold {inverse.numel()} rotary pairs: they need {2 * inverse.numel()}"
        )
    freqs = positions[:, None] * inverse.to(x.device)[None]
    angles = torch.cat([freqs, freqs], dim=-1)
    cos, sin = angles.cos(), angles.sin()
    if factor != 1.0:  # yarn: both q and k, so scores grow by factor^2
        cos, sin = cos * factor, sin * factor
    return x * cos.to(x.dtype) + rotate_half(x) * sin.to(x.dtype)
