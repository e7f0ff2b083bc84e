"""A mixture of experts with a shared expert (Qwen2-MoE): blocks.moe's routed experts plus a gated MLP every
token goes through, scaled by sigmoid(shared_sigmoid_w h) (shared_sigmoid_w (1, D)).

The shared expert's tensors are blocks.gated's under shared_ names (shared_gate_w, shared_in_w, ...); its
units permute and scale against its up branch as a gated MLP's do (spaces mlp, mlp_scale), besides the
experts' spaces of blocks.moe. Its gate reads the pre-normed stream, so the residual classes stay the
pre-norm ones.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from glmc.models.blocks import gated, moe
from glmc.models.blocks.registry import BlockKind
from glmc.models.families.roles import Acts, Role


def _shared(name: str | None) -> str | None:
    return name and name.replace("blocks.{l}.", "blocks.{l}.shared_")


ROLES = (
    *moe.ROLES,
    *(Role(_shared(r.name), r.stage, r.acts, reads=_shared(r.reads), bias=_shared(r.bias)) for r in gated.ROLES),
    Role("blocks.{l}.shared_sigmoid_w", "mlp", (Acts("residual", 1, "in"),)),
)


def mlp(config, p, pre, h, act, rec) -> Tensor:
    """The routed experts plus the gated shared expert (its activations recorded as shared_mlp_act)."""
    shared = gated.mlp(config, p, pre + "shared_", h, act, rec)
    return moe.experts(config, p, pre, h, act, rec) + torch.sigmoid(F.linear(h, p[pre + "shared_sigmoid_w"])) * shared


KIND = BlockKind("moe_shared", "mlp", mlp, ROLES)
