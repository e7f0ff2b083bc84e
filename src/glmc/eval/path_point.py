"""A point of a path between two large models, interpolated a layer at a time while the forward runs.

The evaluator's plain point, sum_i w_i theta_i, is a third model beside the two ends; for a model of a
gigabyte that is the largest thing a run holds. Here each tensor is interpolated when the forward reads
it and dropped when the forward moves on, with the same operations on each element as the whole point
(interpolation.merge_params, interpolation.interpolate_state_dicts), so the losses are the same floats:

- canonical ends: `MergedParams`, a mapping canonical_forward reads, which merges one layer's tensors (or
  one part's outside the layers) when one of them is asked for and keeps only the last;
- other models (a Hugging Face vanilla path): `interpolated_forward`, which runs the reference model with
  each unit's parameters replaced by the interpolated ones only while that unit runs; a unit is a layer
  (a child of a ModuleList, with everything in it) or any other module's own parameters (an embedding, a
  norm, a head). A model whose module reads another unit's parameters directly would compute with the
  reference's there: the path's far end then misses B's own loss, which the pipeline checks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence

import torch
from torch import Tensor, nn

from glmc.interpolation import check_same_layout, merge_params, weighted_sum
from glmc.models.families.roles import layer_of


class MergedParams(Mapping[str, Tensor]):
    """merge_params(params, weights, circuits), a layer (or an outside tensor) at a time as it is read."""

    def __init__(self, params: Sequence[dict[str, Tensor]], weights: Sequence[float], circuits: Sequence[str] = ()):
        self.params, self.weights, self.circuits = params, [float(w) for w in weights], tuple(circuits)
        self.groups: dict[object, list[str]] = {}
        for name in params[0]:  # a layer, or a part outside the layers ("embed.*", "head.*"): read together
            layer = layer_of(name)
            self.groups.setdefault(name.split(".")[0] if layer is None else layer, []).append(name)
        self.group_of = {name: key for key, names in self.groups.items() for name in names}
        self.kept_key: object = None
        self.kept: dict[str, Tensor] = {}

    def __getitem__(self, name: str) -> Tensor:
        key = self.group_of[name]  # KeyError for a name the models lack, as a dict
        if key != self.kept_key:
            self.kept = {}  # the last group freed before the next is built
            names = self.groups[key]
            self.kept = merge_params([{n: p[n] for n in names} for p in self.params], self.weights, self.circuits)
            self.kept_key = key
        return self.kept[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.params[0])

    def __len__(self) -> int:
        return len(self.params[0])


def _units(model: nn.Module) -> list[tuple[nn.Module, bool]]:
    """(module, whole): each child of a ModuleList with all its parameters, and every other module that
    holds parameters of its own, those only."""
    units: list[tuple[nn.Module, bool]] = []

    def visit(module: nn.Module) -> None:
        if isinstance(module, nn.ModuleList):
            units.extend((child, True) for child in module)
            return
        if any(p is not None for p in module._parameters.values()):
            units.append((module, False))
        for child in module.children():
            visit(child)

    visit(model)
    return units


def _slots(module: nn.Module, whole: bool) -> list[tuple[nn.Module, str, Tensor]]:
    """(owner, name, parameter) of every parameter slot a unit holds (a tied parameter in each of its slots)."""
    owners = module.modules() if whole else [module]
    return [(owner, name, p) for owner in owners for name, p in owner._parameters.items() if p is not None]


@contextlib.contextmanager
def interpolated_forward(
    model: nn.Module, tensors: Sequence[dict[str, Tensor]], weights: Sequence[float]
) -> Iterator[nn.Module]:
    """`model` (the reference, whose own parameters are tensors[0]'s) computing at sum_i weights[i] *
    tensors[i] (state dicts of parameters and buffers, as interpolate_state_dicts takes), each unit's
    parameters interpolated while it runs; its buffers (small) for the whole forward, integer ones the
    reference's. Everything is put back on exit."""
    check_same_layout(tensors, weights)
    weights = [float(w) for w in weights]
    first_name = {id(p): name for name, p in model.named_parameters()}  # a tied parameter's one key
    buffers = [(owner, name) for owner in model.modules() for name, b in owner._buffers.items() if b is not None]
    buffer_key = {id(b): name for name, b in model.named_buffers()}
    saved_buffers = [(owner, name, owner._buffers[name]) for owner, name in buffers]
    handles = []

    def swap_in(unit: nn.Module, whole: bool):
        slots = _slots(unit, whole)
        keys = [first_name[id(p)] for _, _, p in slots]
        merged = weighted_sum([[t[k] for k in keys] for t in tensors], weights, [str(i) for i in range(len(keys))])
        for i, (owner, name, _) in enumerate(slots):
            owner._parameters[name] = merged[str(i)]
        return slots

    for unit, whole in _units(model):
        restore: list[list[tuple[nn.Module, str, Tensor]]] = []

        def pre(module, args, unit=unit, whole=whole, restore=restore):
            restore.append(swap_in(unit, whole))

        def post(module, args, output, restore=restore):
            for owner, name, p in restore.pop():
                owner._parameters[name] = p

        handles += [unit.register_forward_pre_hook(pre), unit.register_forward_hook(post)]
    all_slots = _slots(model, True)
    try:
        for (owner, name, b), key in zip(saved_buffers, (buffer_key[id(b)] for _, _, b in saved_buffers)):
            if torch.is_floating_point(b):
                owner._buffers[name] = weighted_sum([[t[key]] for t in tensors], weights, [key])[key]
            else:
                owner._buffers[name] = tensors[0][key]
        yield model
    finally:
        for handle in handles:
            handle.remove()
        for owner, name, p in all_slots:  # an error inside a unit leaves nothing swapped
            owner._parameters[name] = p
        for owner, name, b in saved_buffers:
            owner._buffers[name] = b
