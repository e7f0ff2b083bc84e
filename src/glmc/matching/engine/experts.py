"""Weight matching's step for mixtures of experts (blocks.moe): each expert's units are matched to every
expert of A's on the exact inner product of their weights, then experts are assigned (router rows with them)
on the matched similarity plus the router rows' inner product.

For A's expert i and B's expert j, S_ij[u, v] = <gate_A iu, gate_B jv> + <up_A iu, up_B jv> +
<down_A iu, down_B jv> (B's weights under the residual map found so far): the inner product that a unit
permutation of j adds to <theta_A, T(theta_B)>, so maximising it minimises the distance. Its best
permutation gives the matched value v_ij; the experts' order maximises sum_i v_i,sigma(i) +
<router_A i, router_B sigma(i)>. Without reordering (reorder=False) sigma is the identity and each expert's
units are matched to the same expert of A's.

blocks.moe names weight_step as its weight-matching step: the search runs it where it matches MLP units,
reordering experts unless the matcher's option `experts` is "fixed" (matcher.weight.experts).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from glmc.matching.engine.problem import MatchingProblem, SearchState
from glmc.symmetry import Permutation

Params = dict[str, Tensor]


def _unit_rows(p: Params, layer: int) -> Tensor:
    """(E, F, 3D): per expert and unit its gate row, up row and down column, side by side."""
    pre = f"blocks.{layer}."
    down = p[pre + "expert_out_w"].transpose(1, 2)
    return torch.cat([p[pre + "expert_gate_w"], p[pre + "expert_in_w"], down], -1)


def match_experts(pa: Params, pb: Params, layer: int, reorder: bool = True) -> tuple[Permutation, Permutation]:
    """(the experts' order, (E, F) each new expert's unit order) taking B's layer `layer` closest to A's."""
    ra, rb = _unit_rows(pa, layer).double(), _unit_rows(pb, layer).double()
    experts = ra.shape[0]
    pairs = [(i, j) for i in range(experts) for j in range(experts)] if reorder else [(i, i) for i in range(experts)]
    similarity = torch.einsum("ufd,vgd->uvfg", ra, rb) if reorder else None
    units: dict[tuple[int, int], Permutation] = {}
    value = torch.full((experts, experts), -torch.inf, dtype=torch.float64)
    for i, j in pairs:
        s = similarity[i, j] if similarity is not None else ra[i] @ rb[j].T
        units[i, j] = Permutation.project(s)
        value[i, j] = s.gather(1, units[i, j].perm[:, None]).sum()
    if reorder:
        pre = f"blocks.{layer}."
        routers = pa[pre + "router_w"].double() @ pb[pre + "router_w"].double().T
        order = Permutation.project(value + routers.cpu())
    else:
        order = Permutation.identity(experts)
    order = Permutation(order.perm.to(pb[f"blocks.{layer}.router_w"].device))
    per_expert = torch.stack([units[i, int(j)].perm for i, j in enumerate(order.perm)])
    return order, Permutation(per_expert)


class ExpertsStep:
    """Per layer the experts' order and each expert's units (match_experts), on B under the new residual
    map; `reorder=False` keeps the experts' order. A step as weight_steps.Step's are (called with the
    search state and the iteration, timed under `name`)."""

    name = "experts"

    def __init__(self, problem: MatchingProblem, reorder: bool):
        self.problem, self.reorder = problem, reorder

    def __call__(self, state: SearchState, it: int) -> None:
        p = self.problem
        for l in p.layers:
            order, units = match_experts(p.pa, state.pb_res, l, self.reorder)
            state.perms[f"experts.{l}"], state.perms[f"expert_units.{l}"] = order, units


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
