"""theta(lam) = lam theta_A + (1 - lam) theta_B of factored canonical params, inside the autograd graph.

With circuits=True the attention is interpolated as circuits, QK(lam) = lam QK_A + (1 - lam) QK_B and
OV(lam) = lam OV_A + (1 - lam) OV_B, the path the pipeline evaluates. That merged circuit has rank up
to 2 d_head, and it is exactly a factored head of dimension 2 d_head:
  Q~ = [sqrt(lam) Q~_A; sqrt(1 - lam) Q~_B],  K~ = [sqrt(lam) K~_A; sqrt(1 - lam) K~_B],
  V~ = [V~_A; V~_B],                          W_O = [lam W_O,A | (1 - lam) W_O,B]
(Q~ = [W_q | b_q] with the bias column). canonical_forward on these stacked heads costs about twice a
factored forward, while the (D+1) x (D+1) circuit forward costs D / d_head times more.
"""
from __future__ import annotations

import math
import re

import torch
from torch import Tensor

_ATTENTION = re.compile(r"blocks\.\d+\.(q_w|q_b|k_w|k_b|v_w|v_b|o_w)$")  # o_b is a plain vector


def interpolate_params(pa: dict[str, Tensor], pb: dict[str, Tensor], lam: float, circuits: bool) -> dict[str, Tensor]:
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lam={lam} is outside [0, 1]")
    out = {}
    for name, a in pa.items():
        b = pb[name]
        m = _ATTENTION.search(name) if circuits else None
        if m is None:
            out[name] = lam * a + (1.0 - lam) * b
        elif m.group(1)[0] in "qk":
            out[name] = torch.cat([math.sqrt(lam) * a, math.sqrt(1.0 - lam) * b], dim=1)
        elif m.group(1)[0] == "v":
            out[name] = torch.cat([a, b], dim=1)
        else:  # o_w (H, D, dv): heads' value dims are its last axis
            out[name] = torch.cat([lam * a, (1.0 - lam) * b], dim=2)
    return out
