"""B's layer weights under a transform, computed one layer at a time as they are read.

Weight matching reads B transformed several times per iteration, layer by layer; held whole, each is a
copy of B's blocks (three or four at once for a 1B-parameter model). Transforming a layer when one of
its tensors is asked for, keeping only the last, gives the same tensors (the same operations in the
same order) while holding a layer's copy or two; a layer read again is computed again.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping

from torch import Tensor

from glmc.models.families.roles import layer_of
from glmc.symmetry import SymmetrySpec, Transform, apply_params

KEEP = 1


class LayerwiseParams(Mapping[str, Tensor]):
    """`source` (a dict or another LayerwiseParams) under `transform`, one layer at a time."""

    def __init__(self, source: Mapping[str, Tensor], transform: Transform, spec: SymmetrySpec):
        # the elements as they are now: the search goes on updating its own transform
        self.source, self.transform, self.spec = source, Transform(transform), spec
        self.names: dict[int | None, list[str]] = {}
        for name in source:
            self.names.setdefault(layer_of(name), []).append(name)
        # the last KEEP layers computed, newest last (a large search solves its layers one at a time)
        self.kept: OrderedDict[int | None, dict[str, Tensor]] = OrderedDict()
        self.specs: dict[int | None, tuple[SymmetrySpec, Transform]] = {}
        self.lock = threading.Lock()

    def _restricted(self, layer: int | None) -> tuple[SymmetrySpec, Transform]:
        if layer not in self.specs:
            spec = self.spec.restricted_to(set(self.names[layer]))
            self.specs[layer] = spec, Transform({k: g for k, g in self.transform.items() if k in spec.spaces})
        return self.specs[layer]

    def __getitem__(self, name: str) -> Tensor:
        layer = layer_of(name)
        with self.lock:
            tensors = self.kept.get(layer)
            if tensors is None:
                spec, transform = self._restricted(layer)
                tensors = apply_params(transform, spec, {n: self.source[n] for n in self.names[layer]})
                self.kept[layer] = tensors
                while len(self.kept) > KEEP:
                    self.kept.popitem(last=False)
            else:
                self.kept.move_to_end(layer)
            return tensors[name]

    def forget(self) -> None:
        """Drops the layers kept: the next read computes its layer again (between a search's steps)."""
        with self.lock:
            self.kept.clear()

    def __iter__(self) -> Iterator[str]:
        return iter(self.source)

    def __len__(self) -> int:
        return len(self.source)
