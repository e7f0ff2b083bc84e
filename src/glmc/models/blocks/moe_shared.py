"""A mixture of experts with a shared expert (Qwen2-MoE): blocks.moe's routed experts plus a gated MLP every
token goes through, scaled by sigmoid(shared_sigmoid_w h) (shared_sigmoid_w (1, D)).

The shared expert's tensors are blocks.gated's under their own names (gate_w, in_w, out_w and biases; the
experts' are expert_*), so its units permute and scale against its up branch as a gated MLP's do (spaces mlp,
mlp_scale), and whatever matches gated MLP units matches them, besides the experts' spaces of blocks.moe.
Its gate reads the pre-normed stream, so the residual classes stay the pre-norm ones. The experts match,
and take their settings, as blocks.moe's do.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import Tensor

from glmc.models.blocks import gated, moe
from glmc.models.blocks.registry import BlockKind
from glmc.models.families.roles import Acts, Role

ROLES = (*moe.ROLES, *gated.ROLES, Role("blocks.{l}.shared_sigmoid_w", "mlp", (Acts("residual", 1, "in"),)))


def mlp(config, p, pre, h, act, rec) -> Tensor:
    """The routed experts plus the gated shared expert (its units recorded as mlp_act)."""
    shared = gated.mlp(config, p, pre, h, act, rec)
    return moe.experts(config, p, pre, h, act, rec) + torch.sigmoid(F.linear(h, p[pre + "shared_sigmoid_w"])) * shared


KIND: BlockKind = dataclasses.replace(moe.KIND, name="moe_shared", forward=mlp, roles=ROLES)
