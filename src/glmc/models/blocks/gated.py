"""The gated MLP (SwiGLU and kin): out_w (act(gate_w h + gate_b) * (in_w h + in_b)) + out_b. Its units
permute; mlp_scale: the linear up branch's unit rows may be scaled against out_w's columns."""

from __future__ import annotations

import torch.nn.functional as F

from glmc.models.blocks.registry import BlockKind
from glmc.models.families.roles import Acts, block_role

R, M, MS = "residual", "mlp", "mlp_scale"

ROLES = (
    block_role("gate_w", "mlp", Acts(R, 1, "in"), Acts(M, 0, "out"), reads="mlp_in"),
    block_role("gate_b", "mlp", Acts(M, 0, "out")),
    block_role("in_w", "mlp", Acts(R, 1, "in"), Acts(M, 0, "out"), Acts(MS, 0, "out"), reads="mlp_in"),
    block_role("in_b", "mlp", Acts(M, 0, "out"), Acts(MS, 0, "out")),
    block_role("out_w", "mlp", Acts(R, 0, "out"), Acts(M, 1, "in"), Acts(MS, 1, "in"), reads="mlp_act"),
    block_role("out_b", "mlp", Acts(R, 0, "out")),
)


def mlp(config, p, pre, h, act, rec):
    """The gate branch goes through the activation, the in (up) branch stays linear."""
    a = act(F.linear(h, p[pre + "gate_w"], p[pre + "gate_b"])) * F.linear(h, p[pre + "in_w"], p[pre + "in_b"])
    rec(pre + "mlp_act", a)
    return F.linear(a, p[pre + "out_w"], p[pre + "out_b"])


KIND = BlockKind("gated", "mlp", mlp, ROLES)
