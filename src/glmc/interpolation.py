"""Weighted averages of models, sum_i w_i theta_i, in the parameterisation given (differentiable). Canonical
models may interpolate attention as circuits, QK = sum_i w_i Q~_i^T K~_i and OV = sum_i w_i W_O,i V~_i: exactly
  Q~ = [sqrt(w_1) Q~_1; ...],  K~ = [sqrt(w_1) K~_1; ...],  V~ = [V~_1; ...],  W_O = [w_1 W_O,1 | ...],
a canonical model of stacked heads (rotary ones too). Models of weight 0 are left out; the norm's epsilon is
interpolated where the models' differ (merge_configs), so a path ends at each model's own."""

from __future__ import annotations

import copy
import dataclasses
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from functools import cache

import torch
from torch import Tensor

from glmc.models.blocks import block_kind, kind_names
from glmc.models.canonical import CanonicalConfig, CanonicalTransformer
from glmc.models.families.roles import HEAD_PAIRS, Acts, Role, layer_of, role_key


def _min_axes(role: Role) -> int:
    """The fewest axes a tensor of this role has: one more than the last axis a space acts on."""
    return 1 + max((a.axis for a in role.acts), default=-1)


@cache
def _pair_axes(layer: frozenset[tuple[str, int]]) -> dict[str, Acts]:
    """Role key -> where a head pair (qk or vo) acts on it, for the factored attention kind whose tensors a
    layer holds (`layer`: each tensor's role key and number of axes): of the kinds whose every role is
    there, the one with the most roles, then the most axes (grouped over full attention). A kind without
    a pair's space (query/key norms) interpolates those tensors linearly."""
    axes = dict(layer)
    kinds = [block_kind(name) for name in kind_names()]
    fits = [
        k for k in kinds if k.sublayer == "attention" and all(axes.get(r.name, -1) >= _min_axes(r) for r in k.roles)
    ]
    kind = max(fits, key=lambda k: (len(k.roles), sum(map(_min_axes, k.roles))), default=None)
    roles = kind.roles if kind else ()
    return {r.name: a for r in roles for a in r.acts if a.space in HEAD_PAIRS}


def _layer_keys(params: dict[str, Tensor]) -> dict[int | None, frozenset[tuple[str, int]]]:
    """Per layer, its tensors' role keys and numbers of axes: what _pair_axes reads."""
    keys: dict[int | None, set[tuple[str, int]]] = defaultdict(set)
    for name, t in params.items():
        keys[layer_of(name)].add((role_key(name), t.dim()))
    return {layer: frozenset(k) for layer, k in keys.items()}


def merge_configs(configs: Sequence[CanonicalConfig], weights: Sequence[float]) -> CanonicalConfig:
    """The config of sum_i weights[i] * model_i: configs[0], with norm_eps = sum_i weights[i] * eps_i
    where the epsilons differ (the path's ends are then each model's own epsilon, exactly); configs[0]
    itself where they agree, so paths between models of one epsilon are unchanged."""
    eps = [c.norm_eps for c in configs]
    if len(set(eps)) <= 1:
        return configs[0]
    if len(configs) != len(weights):
        raise ValueError(f"{len(configs)} configs but {len(weights)} weights")
    kept = [(float(w), e) for w, e in zip(weights, eps) if w != 0]
    if not kept:
        return configs[0]
    if len(kept) == 1 and kept[0][0] == 1.0:  # an endpoint: its own epsilon, bit for bit
        return dataclasses.replace(configs[0], norm_eps=kept[0][1])
    return dataclasses.replace(configs[0], norm_eps=sum(w * e for w, e in kept))


def check_finite(weights: Sequence[float], name: str = "weights") -> None:
    """TypeError for a weight that is not a number, ValueError for a NaN or infinite one (it would make every
    parameter of the result NaN), each naming its place in `name`."""
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Iterable):
        raise TypeError(f"{name}={weights!r} is not a sequence of numbers: pass one weight per model, e.g. [0.5, 0.5]")
    for i, w in enumerate(weights):
        try:
            value = float(w)
        except (TypeError, ValueError):
            raise TypeError(f"{name}[{i}]={w!r} is not a number") from None
        if not math.isfinite(value):
            raise ValueError(
                f"{name}[{i}]={value} is not a finite number (it would make every parameter NaN): pass finite "
                "weights, e.g. [lam, 1 - lam] for a point on the path between two models"
            )


def _check_weights(weights: Sequence[float], circuits: Sequence[str]) -> None:
    if circuits and any(w < 0 for w in weights):
        raise ValueError(f"weights {list(weights)}: circuit interpolation needs non-negative weights")


def merge_params(
    params: Sequence[dict[str, Tensor]], weights: Sequence[float], circuits: Sequence[str] = ()
) -> dict[str, Tensor]:
    """sum_i weights[i] * params[i] of factored canonical params, pairs in `circuits` as circuits."""
    if len(params) != len(weights):
        raise ValueError(f"{len(params)} models but {len(weights)} weights")
    bad = set(circuits) - set(HEAD_PAIRS)
    if bad:
        raise ValueError(f"circuits={list(circuits)}: only 'qk' and 'vo' pairs can be interpolated as circuits")
    _check_weights(weights, circuits)
    kept = [(float(w), p) for w, p in zip(weights, params) if w != 0] or [(0.0, params[0])]
    if len(kept) == 1 and kept[0][0] == 1.0:  # an endpoint: its own tensors
        return dict(kept[0][1])
    out, plain = {}, []
    layers = _layer_keys(kept[0][1]) if circuits else {}
    for name in kept[0][1]:
        acts = _pair_axes(layers[layer_of(name)]).get(role_key(name)) if circuits else None
        if acts is None or acts.space not in circuits:
            plain.append(name)
        elif acts.space == "qk":  # q and k (H, dh, D), (H, dh): sqrt(w) on each side of q k^T
            out[name] = torch.cat([math.sqrt(w) * p[name] for w, p in kept], dim=acts.axis)
        elif acts.side == "out":  # v: stacked as it is
            out[name] = torch.cat([p[name] for _, p in kept], dim=acts.axis)
        else:  # o_w (H, D, dv): the whole weight, the heads' value dims its last axis
            out[name] = torch.cat([w * p[name] for w, p in kept], dim=acts.axis)
    out.update(weighted_sum([[p[n] for n in plain] for _, p in kept], [w for w, _ in kept], plain))
    return out


def weighted_sum(tensor_lists: Sequence[list[Tensor]], weights: Sequence[float], names: list[str]) -> dict[str, Tensor]:
    """names[j] -> sum_i weights[i] * tensor_lists[i][j], one fused kernel launch per model."""
    if not names:
        return {}
    total = torch._foreach_mul(list(tensor_lists[0]), weights[0])
    for tensors, w in zip(tensor_lists[1:], weights[1:]):
        torch._foreach_add_(total, list(tensors), alpha=w)
    return dict(zip(names, total))


def interpolate_state_dicts(state_dicts: Sequence[dict[str, Tensor]], weights: Sequence[float]) -> dict[str, Tensor]:
    """sum_i weights[i] * state_dicts[i] for floating tensors; integer buffers are taken from the first."""
    check_same_layout(state_dicts, weights)
    first = state_dicts[0]
    floating = [name for name, t in first.items() if torch.is_floating_point(t)]
    out = {name: t for name, t in first.items() if not torch.is_floating_point(t)}  # ids, masks: not averaged
    out.update(weighted_sum([[sd[n] for n in floating] for sd in state_dicts], [float(w) for w in weights], floating))
    return {name: out[name] for name in first}


def check_same_layout(state_dicts: Sequence[dict[str, Tensor]], weights: Sequence[float]) -> None:
    """ValueError naming the first parameter that one model lacks or holds in another shape than model 0."""
    if len(state_dicts) != len(weights):
        raise ValueError(f"{len(state_dicts)} models but {len(weights)} weights")
    first = state_dicts[0]
    for i, sd in enumerate(state_dicts[1:], 1):
        if sd.keys() != first.keys():
            raise ValueError(f"model {i} has different parameters than model 0: {sorted(set(sd) ^ set(first))[:5]}")
        for name, t in sd.items():
            if t.shape != first[name].shape:
                raise ValueError(
                    f"{name}: shape {tuple(t.shape)} in model {i} but {tuple(first[name].shape)} in model 0"
                )


def interpolate(
    models: Sequence[torch.nn.Module], weights: Sequence[float], circuits: Sequence[str] = ()
) -> torch.nn.Module:
    """A new model whose parameters are sum_i weights[i] * models[i]: factored canonical models by
    `merge_params`, any others by their state dicts, into a copy of models[0] (of the first model with the
    most tensors of its own where they differ: an untied output head where another model's is tied, which a
    tied copy could not hold apart from its embedding)."""
    check_finite(weights)
    if all(isinstance(m, CanonicalTransformer) and m.config.form == "factored" for m in models):
        with torch.no_grad():
            merged = merge_params([m.params() for m in models], weights, circuits)
        return CanonicalTransformer(merge_configs([m.config for m in models], weights), merged)
    if circuits:
        raise ValueError("circuits= applies to factored canonical models (glmc.to_canonical)")
    merged_model = copy.deepcopy(max(models, key=lambda m: len(dict(m.named_parameters()))))
    with torch.no_grad():
        merged_model.load_state_dict(interpolate_state_dicts([m.state_dict() for m in models], weights))
    return merged_model
