"""Weight matching's step for mixtures of experts (blocks.moe): each expert's units are matched to every
expert of A's on a cost their up/down scale leaves unchanged, then experts are assigned (router rows with
them), then each matched unit's up/down scale is set.

For A's expert i and B's expert j, S_ij[u, v] = cos(gate_A iu, gate_B jv) + cos(up_A iu, up_B jv)
cos(down_A iu, down_B jv) (B's weights under the residual map found so far): a gated MLP's unit cost
(engine.mlp_units), which a unit's scale and sign of up against down leave unchanged. Its best permutation
gives the matched value v_ij; the experts' order maximises sum_i v_i,sigma(i) + cos(router_A i,
router_B sigma(i)). Without reordering (reorder=False) sigma is the identity and each expert's units are
matched to the same expert of A's. Each unit's scale (space expert_scale) then minimises the distance of
its up row and down column to A's partner's (mlp_units.up_down_scales), as a gated MLP's do.

blocks.moe names weight_step as its weight-matching step: the search runs it where it matches MLP units,
reordering experts unless the matcher's option `experts` is "fixed" (matcher.weight.experts).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from glmc.matching.engine.mlp_units import up_down_scales
from glmc.matching.engine.problem import MatchingProblem, SearchState
from glmc.symmetry import Diagonal, Permutation, Transform

Params = dict[str, Tensor]
BRANCHES = ("gate", "up", "down")


def _branches(p: Params, layer: int) -> dict[str, Tensor]:
    """(E, F, D) per expert and unit its gate row, up row and down column."""
    pre = f"blocks.{layer}."
    down = p[pre + "expert_out_w"].transpose(1, 2)
    return {"gate": p[pre + "expert_gate_w"], "up": p[pre + "expert_in_w"], "down": down}


def _unit(t: Tensor) -> Tensor:
    """Rows scaled to unit length (float64)."""
    t = t.double()
    return t / t.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def match_experts(pa: Params, pb: Params, layer: int, reorder: bool = True) -> tuple[Permutation, Permutation]:
    """(the experts' order, (E, F) each new expert's unit order) taking B's layer `layer` closest to A's."""
    ra, rb = (({k: _unit(v) for k, v in _branches(p, layer).items()}) for p in (pa, pb))
    experts = ra["gate"].shape[0]
    pairs = [(i, j) for i in range(experts) for j in range(experts)] if reorder else [(i, i) for i in range(experts)]
    units: dict[tuple[int, int], Permutation] = {}
    value = torch.full((experts, experts), -torch.inf, dtype=torch.float64)
    for i, j in pairs:
        cos = {k: ra[k][i] @ rb[k][j].T for k in BRANCHES}
        s = (cos["gate"] + cos["up"] * cos["down"]).cpu()
        units[i, j] = Permutation.project(s)
        value[i, j] = s.gather(1, units[i, j].perm[:, None]).sum()
    if reorder:
        pre = f"blocks.{layer}."
        routers = _unit(pa[pre + "router_w"]) @ _unit(pb[pre + "router_w"]).T
        order = Permutation.project(value + routers.cpu())
    else:
        order = Permutation.identity(experts)
    device = pb[f"blocks.{layer}.router_w"].device
    per_expert = torch.stack([units[i, int(j)].perm for i, j in enumerate(order.perm)])
    return Permutation(order.perm.to(device)), Permutation(per_expert.to(device))


def expert_scales(pa: Params, pb: Params, layer: int) -> Diagonal:
    """(E, F) per expert and unit (B's experts and units already matched to A's) the up/down scale nearest
    A's (mlp_units.up_down_scales)."""
    a, b = _branches(pa, layer), _branches(pb, layer)
    return Diagonal(up_down_scales(a["up"], b["up"], a["down"], b["down"]))


class ExpertsStep:
    """Per layer the experts' order, each expert's units (match_experts) and their scales (expert_scales), on
    B under the new residual map; `reorder=False` keeps the experts' order. A step as steps.Step's are
    (called with the search state and the iteration, timed under `name`)."""

    name = "experts"

    def __init__(self, problem: MatchingProblem, reorder: bool):
        self.problem, self.reorder = problem, reorder

    def __call__(self, state: SearchState, it: int) -> None:
        p = self.problem
        for l in p.layers:
            order, units = match_experts(p.pa, state.pb_res, l, self.reorder)
            state.perms[f"experts.{l}"], state.perms[f"expert_units.{l}"] = order, units
        matched = Transform({n: state.perms[n] for l in p.layers for n in (f"experts.{l}", f"expert_units.{l}")})
        moved = p.transformed(matched, p.spec_blocks, state.pb_res)
        state.perms.update({f"expert_scale.{l}": expert_scales(p.pa, moved, l) for l in p.layers})


# matcher.weight.experts: whether the experts are reordered
REORDER = {"permutation": True, "fixed": False}


def weight_step(problem: MatchingProblem, options: Mapping[str, Any]) -> ExpertsStep | None:
    """The experts' step for a search with these options (BlockKind.weight_step): none where MLP units are
    not searched (options["mlp"] false)."""
    if not options["mlp"]:
        return None
    chosen = options.get("experts", "permutation")
    if chosen not in REORDER:
        raise ValueError(f"matcher option experts={chosen!r}: choose permutation (reorder experts) or fixed")
    return ExpertsStep(problem, REORDER[chosen])
