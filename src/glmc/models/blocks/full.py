"""Full multi-head attention: H heads, each with its own queries, keys and values.

q_w, k_w (H, dh, D), q_b, k_b (H, dh), v_w (H, dv, D), v_b (H, dv), o_w (H, D, dv), o_b (D). q k^T is
unchanged by q -> A q, k -> A^-T k per head and o_w v by v -> B v, o_w -> o_w B^-1 (the qk and vo spaces);
heads permute together. Its circuit form holds QK (H, D+1, D+1) and OV (H, D, D+1) per head instead, which
absorb those per-head maps.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from glmc.models.blocks.registry import BlockKind
from glmc.models.families.roles import Acts, block_role

R, H, QK, VO = "residual", "heads", "qk", "vo"

ROLES = (
    block_role("q_w", "attn", Acts(R, 2, "in"), Acts(H, 0, "out"), Acts(QK, 1, "out", head_axis=0), reads="attn_in"),
    block_role("q_b", "attn", Acts(H, 0, "out"), Acts(QK, 1, "out", head_axis=0)),
    block_role("k_w", "attn", Acts(R, 2, "in"), Acts(H, 0, "out"), Acts(QK, 1, "in", head_axis=0), reads="attn_in"),
    block_role("k_b", "attn", Acts(H, 0, "out"), Acts(QK, 1, "in", head_axis=0)),
    block_role("v_w", "attn", Acts(R, 2, "in"), Acts(H, 0, "out"), Acts(VO, 1, "out", head_axis=0), reads="attn_in"),
    block_role("v_b", "attn", Acts(H, 0, "out"), Acts(VO, 1, "out", head_axis=0)),
    block_role("o_w", "attn", Acts(R, 1, "out"), Acts(H, 0, "in"), Acts(VO, 2, "in", head_axis=0), reads="heads"),
    block_role("o_b", "attn", Acts(R, 0, "out")),
)

# QK (H, D+1, D+1) reads [x; 1] on both sides; OV (H, D, D+1) writes D and reads [x; 1]
CIRCUIT_ROLES = (
    block_role("qk", "attn", Acts(R, 1, "in", extra=1), Acts(R, 2, "in", extra=1), Acts(H, 0, "out")),
    block_role("ov", "attn", Acts(R, 1, "out"), Acts(R, 2, "in", extra=1), Acts(H, 0, "in")),
    block_role("o_b", "attn", Acts(R, 0, "out")),
)


def head_projections(h: Tensor, p: dict[str, Tensor], pre: str, names: tuple[str, ...]) -> list[Tensor]:
    """(B, H, T, e) per name of h's per-head projections by p[pre + name + "_w"] (H, e, D) and "_b", in one product."""
    weights = [p[pre + n + "_w"] for n in names]
    y = F.linear(
        h, torch.cat([w.flatten(0, 1) for w in weights]), torch.cat([p[pre + n + "_b"].flatten() for n in names])
    )
    out = []
    for w, part in zip(weights, y.split([w.shape[0] * w.shape[1] for w in weights], -1)):
        out.append(part.unflatten(-1, w.shape[:2]).transpose(1, 2))
    return out


def head_output(z: Tensor, o_w: Tensor) -> Tensor:
    """sum_h z[:, h] o_w[h]^T for z (B, H, T, e) and o_w (H, D, e), as one product."""
    return F.linear(z.transpose(1, 2).flatten(2), o_w.transpose(0, 1).flatten(1))


def attention(config, p, pre, h, record=None):
    q, k, v = head_projections(h, p, pre, ("q", "k", "v"))
    z = F.scaled_dot_product_attention(q, k, v, is_causal=config.causal, scale=1.0)
    if record is not None:
        record(pre + "heads", z)
    return head_output(z, p[pre + "o_w"])


def circuit_attention(config, p, pre, h, record=None):
    ht = torch.cat([h, h.new_ones(*h.shape[:-1], 1)], dim=-1)  # x~ = [x; 1]
    scores = torch.einsum("bid,hde,bje->bhij", ht, p[pre + "qk"], ht)
    if config.causal:
        t = scores.shape[-1]
        mask = torch.ones(t, t, dtype=torch.bool, device=h.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
    att = scores.softmax(-1)
    values = torch.einsum("bjd,hed->bhje", ht, p[pre + "ov"])  # (B, H, T, D)
    return torch.einsum("bhij,bhjd->bid", att, values)


KIND = BlockKind(
    "full",
    "attention",
    attention,
    ROLES,
    head_spaces=frozenset({QK, VO}),
    circuit=BlockKind("full.circuit", "attention", circuit_attention, CIRCUIT_ROLES),
)
