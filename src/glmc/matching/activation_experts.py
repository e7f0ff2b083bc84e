"""Activation matching for mixtures of experts (blocks.moe): experts and each expert's units from the
correlations of router logits and expert activations on the same tokens.

Every expert runs on every token in the canonical forward, so each expert's units have activations on all
tokens. For A's expert i and B's expert j, the units are assigned on the correlation of their activations;
the experts' order then maximises, summed over experts, the mean correlation of the matched units plus the
correlation of the two experts' router logits. blocks.moe names `match` as its activation hook.
"""

from __future__ import annotations

import torch
from torch import Tensor

from glmc.matching.activation import mean_matched
from glmc.symmetry import Permutation, SymmetrySpec, Transform


def expert_assignment(units: Tensor, router: Tensor, experts: int) -> tuple[Permutation, Permutation, Tensor]:
    """(the experts' order, (E, F) each new expert's unit order, the (E, E) expert similarity) from `units`,
    the (E*F, E*F) correlation of A's and B's expert activations (expert-major), and `router`, the (E, E)
    correlation of their router logits."""
    size = units.shape[0] // experts
    blocks = units.reshape(experts, size, experts, size).permute(0, 2, 1, 3).double().cpu()
    perms: dict[tuple[int, int], Tensor] = {}
    value = router.double().cpu().clone()
    for i in range(experts):
        for j in range(experts):
            perms[i, j] = Permutation.project(blocks[i, j]).perm
            value[i, j] += blocks[i, j].gather(1, perms[i, j][:, None]).mean()
    order = Permutation.project(value)
    return order, Permutation(torch.stack([perms[i, int(j)] for i, j in enumerate(order.perm)])), value


def match(moments: dict, spec: SymmetrySpec, l: int, transform: Transform, correlation: dict) -> None:
    """Layer l's experts and each expert's units into `transform` (expert_assignment) from the recorded
    router logits and expert activations, the mean correlation of the experts' router logits (before,
    after) into `correlation` (the hook's call: blocks.registry.ActivationHook)."""
    router, units = (moments[f"blocks.{l}.{s}"].correlation() for s in ("router_logits", "expert_act"))
    order, units, _ = expert_assignment(units, router, spec[f"experts.{l}"].size)
    transform[f"experts.{l}"], transform[f"expert_units.{l}"] = order, units
    correlation[f"experts.{l}"] = (mean_matched(router), mean_matched(router, order.perm))
