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
dims plus a plain bilinear form q_p^T k_p on the rest. Where Hugging Face's count int(d * rotary_pct)
= n is odd, its tables hold the ceil(n / 2) frequencies theta^(-2i/n) side by side, so r = n + 1 dims
rotate as pairs (i, i + r/2) at the frequencies of n (`freq_dim` = n, `rotating_dims`): every rotating
dim is in a pair, and the maps below are the same. A map of the query space survives when it is a
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
    """f_i = theta^(-2i/d) for i < ceil(d/2), the pairs' frequencies (computed in float32 as Hugging Face
    does, unless float64); an odd d is Hugging Face's odd partial rotary count (`rotating_dims`)."""
    if head_dim < 1:
        raise ValueError(f"rotary embeddings need at least one dimension, got {head_dim}")
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=dtype) / head_dim))


def rotating_dims(hf_dims: int) -> int:
    """The dims Hugging Face's rotate-half rotates when a config gives `hf_dims` = int(head_dim *
    partial_rotary_factor): its cos and sin tables repeat the ceil(hf_dims / 2) frequencies twice, and
    that many leading dims of the head rotate, so an odd count rotates one dim more."""
    return hf_dims + hf_dims % 2


# scaled types whose frequencies are a function of each unscaled frequency alone (not of the pair's index
# or the count of dims), so equal unscaled frequencies stay equal under them
ELEMENTWISE_TYPES = ("linear", "llama3")


def same_frequency_pairs(pairs: int, freq_dim: int, to_pairs: int, to_freq_dim: int, scaling: dict | None) -> list[int]:
    """For each of `pairs` rotary pairs at theta^(-2i/freq_dim) (i < pairs), the index j < to_pairs of the
    pair at theta^(-2j/to_freq_dim) that turns at the same frequency at every position, for any theta:
    j = i * to_freq_dim / freq_dim. ValueError saying which pair has none, or which scaling reads the
    count of dims (dynamic, yarn) when the counts differ."""
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
    freq_dim: int | None = None,
) -> Tensor:
    """Rotate (..., T, d) head vectors by their positions 0 .. T-1. With `head_dim` < d, the vector holds
    d / head_dim heads stacked (circuit interpolation, glmc.interpolation) and each is rotated as its own.
    `rotary_dims`: only the first r dims of each head rotate, as pairs (i, i + r/2), the rest pass
    through (GPT-NeoX's partial rotary); `scaling`: rotary_frequencies' scaling; `freq_dim`: the n of the
    frequencies theta^(-2i/n) where it is not r (Hugging Face's odd count, r = n + 1: rotating_dims)."""
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
