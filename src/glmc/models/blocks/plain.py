"""The plain MLP: out_w act(in_w h + in_b) + out_b, in_w (F, D), out_w (D, F); its units permute (and, for
ReLU-like activations, split into copies and scale: mlp_scale, a unit's in row and bias times a > 0 against
its out column over a; symmetry.spec builds that space only for positively homogeneous activations)."""

from __future__ import annotations

import torch.nn.functional as F

from glmc.models.blocks.registry import BlockKind
from glmc.models.families.roles import Acts, block_role

R, M, MS = "residual", "mlp", "mlp_scale"

ROLES = (
    block_role("in_w", "mlp", Acts(R, 1, "in"), Acts(M, 0, "out"), Acts(MS, 0, "out"), reads="mlp_in"),
    block_role("in_b", "mlp", Acts(M, 0, "out"), Acts(MS, 0, "out")),
    block_role("out_w", "mlp", Acts(R, 0, "out"), Acts(M, 1, "in"), Acts(MS, 1, "in"), reads="mlp_act"),
    block_role("out_b", "mlp", Acts(R, 0, "out")),
)


def mlp(config, p, pre, h, act, rec):
    a = act(F.linear(h, p[pre + "in_w"], p[pre + "in_b"]))
    rec(pre + "mlp_act", a)
    return F.linear(a, p[pre + "out_w"], p[pre + "out_b"])


KIND = BlockKind("plain", "mlp", mlp, ROLES)
