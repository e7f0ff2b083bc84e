"""Weighted averages of models with identical parameter shapes."""
from __future__ import annotations

import copy
from typing import Sequence

import torch


def interpolate_state_dicts(state_dicts: Sequence[dict[str, torch.Tensor]], weights: Sequence[float]) -> dict[str, torch.Tensor]:
    if len(state_dicts) != len(weights):
        raise ValueError(f"{len(state_dicts)} models but {len(weights)} weights")
    first = state_dicts[0]
    for i, sd in enumerate(state_dicts[1:], 1):
        if sd.keys() != first.keys():
            raise ValueError(f"model {i} has different parameters than model 0: {sorted(set(sd) ^ set(first))[:5]}")
        for name, t in sd.items():
            if t.shape != first[name].shape:
                raise ValueError(f"{name}: shape {tuple(t.shape)} in model {i} but {tuple(first[name].shape)} in model 0")
    out = {}
    for name, t in first.items():
        if not torch.is_floating_point(t):  # integer buffers (ids, masks) are not averaged
            out[name] = t.clone()
            continue
        out[name] = sum(w * sd[name] for w, sd in zip(weights, state_dicts))
    return out


def interpolate(models: Sequence[torch.nn.Module], weights: Sequence[float]) -> torch.nn.Module:
    """A new model whose parameters are sum_i weights[i] * models[i] (same module type as models[0])."""
    merged = copy.deepcopy(models[0])
    merged.load_state_dict(interpolate_state_dicts([m.state_dict() for m in models], weights))
    return merged
