"""A mixture of SwiGLU experts (Mixtral, OLMoE, Qwen-MoE): a router picks each token's experts, their
outputs are summed with the router's weights; with a shared expert (Qwen2-MoE) a gated MLP every token goes
through, scaled by a sigmoid gate.

Tensors (E experts of F units, D width): router_w (E, D) reads the pre-normed stream; expert_gate_w,
expert_in_w (E, F, D) and expert_out_w (E, D, F) are the experts stacked, out_w(act(gate_w h) * in_w h)
each. The router's softmax over all experts keeps the top experts_top_k, renormalised to sum to 1 where
experts_renormalise (Mixtral; OLMoE and Qwen-MoE by their norm_topk_prob): the kind's settings, which the
families set in CanonicalConfig.block_settings. The shared expert is blocks.moe_shared.

What keeps the function. Every tensor reads the pre-normed stream and the outputs add linearly, so the
residual classes are the pre-norm ones. Reordering the experts together with the router's rows permutes the
softmax's inputs and outputs alike, so top-k picks the same experts (space experts); within each expert
its units permute on their own (space expert_units, one permutation per expert, batched over the expert
axis); each expert's units scale against their up branch as a gated MLP's do (space expert_scale, one
diagonal per expert, after the units: indexed by new experts and units); the shared expert's units
permute and scale as a gated MLP's do (spaces mlp, mlp_scale).

Matching the experts' spaces: weight matching's step is glmc.matching.engine.experts (its option `experts`:
"fixed" keeps the experts' order and still matches each expert's units and their scales),
activation matching's hook glmc.matching.activation_experts (router logits and expert activations);
learned matching keeps the three spaces as weight matching found them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from glmc.models.blocks.registry import ActivationHook, BlockKind
from glmc.models.families.roles import Acts, Role

R, X, XU, XS = "residual", "experts", "expert_units", "expert_scale"


def _expert_role(name: str, *acts: Acts) -> Role:
    return Role("blocks.{l}." + name, "mlp", acts)


ROLES = (
    _expert_role("router_w", Acts(R, 1, "in"), Acts(X, 0, "out")),
    _expert_role("expert_gate_w", Acts(R, 2, "in"), Acts(X, 0, "in"), Acts(XU, 1, "out", head_axis=0)),
    _expert_role(
        "expert_in_w",
        Acts(R, 2, "in"),
        Acts(X, 0, "in"),
        Acts(XU, 1, "out", head_axis=0),
        Acts(XS, 1, "out", head_axis=0),
    ),
    _expert_role(
        "expert_out_w",
        Acts(R, 1, "out"),
        Acts(X, 0, "in"),
        Acts(XU, 2, "in", head_axis=0),
        Acts(XS, 2, "in", head_axis=0),
    ),
)


def routing(settings, logits: Tensor) -> Tensor:
    """(..., E) weight of each expert per token: the softmax's top-k entries (renormalised where the
    settings say: BlockKind.settings_of), zero elsewhere."""
    probs = torch.softmax(logits, -1)
    top, index = probs.topk(settings.experts_top_k, dim=-1)
    if settings.experts_renormalise:
        top = top / top.sum(-1, keepdim=True)
    return torch.zeros_like(probs).scatter(-1, index, top)


def experts(config, p, pre, h, act, rec) -> Tensor:
    """Every expert on every token (dense: the small models compared here), weighted by the routing."""
    logits = F.linear(h, p[pre + "router_w"])
    rec(pre + "router_logits", logits)
    a = act(torch.einsum("...d,efd->...ef", h, p[pre + "expert_gate_w"]))
    a = a * torch.einsum("...d,efd->...ef", h, p[pre + "expert_in_w"])
    rec(pre + "expert_act", a.flatten(-2))  # (..., E * F): expert-major, as activation matching reads it
    out = torch.einsum("...ef,edf->...ed", a, p[pre + "expert_out_w"])
    return (routing(KIND.settings_of(config), logits).unsqueeze(-1) * out).sum(-2)


KIND = BlockKind(
    "moe",
    "mlp",
    experts,
    ROLES,
    weight_step="glmc.matching.engine.experts:weight_step",
    kept_spaces=(X, XU, XS),
    activation=ActivationHook(("router_logits", "expert_act"), "glmc.matching.activation_experts:match"),
    # the experts each token goes to; whether their weights are renormalised to sum to 1 over those
    settings={"experts_top_k": None, "experts_renormalise": True},
)
