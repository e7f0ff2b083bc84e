"""Activation matching for mixtures of experts (blocks.moe): experts, each expert's units and their scales
from the correlations of router logits and expert activations on the same tokens.

Every expert runs on every token in the canonical forward, so each expert's units have activations on all
tokens. For A's expert i and B's expert j, the units are assigned on the absolute correlation of their
activations (a gated unit's sign is free: its up/down scale); the experts' order then maximises, summed over
experts, the mean matched value plus the correlation of the two experts' router logits. Each matched unit
gets the scale of a gated MLP's (activation.activation_scales: sign(corr) rms(a_A) / rms(a_B)).
blocks.moe names `match` as its activation hook.
"""

from __future__ import annotations

import torch
from torch import Tensor

from glmc.matching.activation import CrossMoments, activation_scales, mean_matched
from glmc.symmetry import Diagonal, Permutation, SymmetrySpec, Transform


def expert_assignment(units: Tensor, router: Tensor, experts: int) -> tuple[Permutation, Permutation, Tensor]:
    """(the experts' order, (E, F) each new expert's unit order, the (E, E) expert similarity) from `units`,
    the (E*F, E*F) similarity of A's and B's expert activations (expert-major; `match` gives their absolute
    correlation), and `router`, the (E, E) correlation of their router logits."""
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
    """Layer l's experts, each expert's units and their scales into `transform` (expert_assignment on the
    absolute unit correlations, then expert_scales) from the recorded router logits and expert activations,
    the mean correlation of the experts' router logits (before, after) into `correlation` (the hook's call:
    blocks.registry.ActivationHook)."""
    acts = moments[f"blocks.{l}.expert_act"]
    router, corr = moments[f"blocks.{l}.router_logits"].correlation(), acts.correlation()
    order, units, _ = expert_assignment(corr.abs(), router, spec[f"experts.{l}"].size)
    transform[f"experts.{l}"], transform[f"expert_units.{l}"] = order, units
    transform[f"expert_scale.{l}"] = expert_scales(acts, corr, order, units)
    correlation[f"experts.{l}"] = (mean_matched(router), mean_matched(router, order.perm))


def expert_scales(moments: CrossMoments, corr: Tensor, order: Permutation, units: Permutation) -> Diagonal:
    """(E, F) per new expert and unit the scale activation_scales gives its flat (expert-major) partner."""
    experts, size = units.perm.shape
    flat = (order.perm.cpu()[:, None] * size + units.perm.cpu()).flatten()
    return Diagonal(activation_scales(moments, corr, flat).scales.reshape(experts, size))
