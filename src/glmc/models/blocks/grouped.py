"""Grouped-query attention (Llama, GPT-NeoX with one query head per group), with rotary positions.

K key/value heads each shared by G query heads: q_w (K, G, dh, D), q_b (K, G, dh), k_w, v_w (K, dh, D),
k_b, v_b (K, dh), o_w (K, G, D, dv), o_b (D); query head k * G + g reads head k. heads: the groups; qheads:
the query heads within a group; qk, vo: one element per group (under rotary positions only the qk maps that
commute with every position's rotation, symmetry.spec). Causal sliding windows mask as Hugging Face does
(their layers rotate unscaled with config.rope_local_theta where set); config.attn_softcap caps the scores with a tanh,
which changes no symmetry (the scores are kept).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from glmc.models.blocks import full
from glmc.models.blocks.registry import BlockKind
from glmc.models.families.roles import Acts, block_role
from glmc.models.rotary import apply_rotary

R, H, QH, QK, VO = "residual", "heads", "qheads", "qk", "vo"

ROLES = (
    block_role(
        "q_w",
        "attn",
        Acts(R, 3, "in"),
        Acts(H, 0, "out"),
        Acts(QH, 1, "out", head_axis=0),
        Acts(QK, 2, "out", head_axis=0),
        reads="attn_in",
    ),
    block_role("q_b", "attn", Acts(H, 0, "out"), Acts(QH, 1, "out", head_axis=0), Acts(QK, 2, "out", head_axis=0)),
    *full.ROLES[2:6],  # k and v: one head per group
    block_role(
        "o_w",
        "attn",
        Acts(R, 2, "out"),
        Acts(H, 0, "in"),
        Acts(QH, 1, "in", head_axis=0),
        Acts(VO, 3, "in", head_axis=0),
        reads="heads",
    ),
    block_role("o_b", "attn", Acts(R, 0, "out")),
)

QueryKeyMap = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]


def attention(config, p, pre, h, record=None, before_rotary: QueryKeyMap | None = None):
    """`before_rotary(q, k)`: what a kind built on this one does to the queries (B, K*G, T, dh) and keys
    (B, K, T, dh) before the rotary positions."""
    q = torch.einsum("btd,kged->bkgte", h, p[pre + "q_w"]) + p[pre + "q_b"][:, :, None]
    group = q.shape[2]
    q = q.flatten(1, 2)
    k = torch.einsum("btd,hed->bhte", h, p[pre + "k_w"]) + p[pre + "k_b"][:, None]
    v = torch.einsum("btd,hed->bhte", h, p[pre + "v_w"]) + p[pre + "v_b"][:, None]
    if before_rotary is not None:
        q, k = before_rotary(q, k)
    window = layer_window(config, pre)
    if config.rope_theta is not None:
        local = window is not None and config.rope_local_theta is not None
        theta, scaling = (config.rope_local_theta, None) if local else (config.rope_theta, config.rope_scaling)
        rotary = (theta, config.rope_dim, config.rotary_dims, scaling, config.rotary_freq_dim)
        q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    mask = None if window is None else window_mask(q.shape[-2], window, h.device)
    if config.attn_softcap is not None:
        z = capped_attention(q, k, v, mask, config.causal, config.attn_softcap)
    else:
        z = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=config.causal and mask is None, scale=1.0)
    if record is not None:
        record(pre + "heads", z)
    return torch.einsum("bhte,hde->btd", z, p[pre + "o_w"].flatten(0, 1))


def capped_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool, cap: float) -> Tensor:
    """Attention whose scores q.k (the scale folded into q) pass through cap * tanh(score / cap) before the
    mask and the softmax (Gemma 2's attention-logit soft-capping)."""
    scores = cap * torch.tanh(q @ k.transpose(-1, -2) / cap)
    if mask is None and causal:
        mask = window_mask(q.shape[-2], q.shape[-2], q.device)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, -1) @ v


def layer_window(config, pre: str) -> int | None:
    """The sliding window of the layer whose tensors start with `pre` ("blocks.{l}."), None for full attention."""
    if config.sliding_window is None:
        return None
    if config.sliding_layers is not None and int(pre.split(".")[1]) not in config.sliding_layers:
        return None
    return config.sliding_window


def window_mask(length: int, window: int, device: torch.device) -> Tensor:
    """(T, T) True where query i attends to key j: 0 <= i - j < window (as Hugging Face's mask)."""
    positions = torch.arange(length, device=device)
    offset = positions[:, None] - positions[None, :]
    return (offset >= 0) & (offset < window)


KIND = BlockKind("grouped", "attention", attention, ROLES, head_spaces=frozenset({QK, VO}))
