"""Layer-wise barriers (Adilova et al., ICLR 2024): the loss along lambda when only one part of the model
(the embedding, one block, the head) is interpolated and every other tensor is held at A, or at B; with
`cumulative`, parts 0..l together. A point is lam * A + (1 - lam) * B on the part's tensors, built by the
path's own merge (merge_params with the alignment's circuits, interpolate_state_dicts for original models)
on those tensors only, so interpolating every part is the straight line, float for float, and no part is
the held end. Parts are canonical names' groups (layer_of); an original Hugging Face model's tensors are
grouped by module path (the first numeric component is the block; modules before the first block are the
embedding, after the last the head, a tied output head going with the embedding it shares)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm

from glmc.alignment import Alignment
from glmc.eval.barrier import barrier
from glmc.eval.evaluator import Evaluator, Functional, checked_lambdas
from glmc.interpolation import interpolate_state_dicts, merge_configs, merge_params
from glmc.models.families.roles import layer_of

HELD = ("a", "b")  # the end the parts not interpolated are held at
log = logging.getLogger(__name__)


def _block_of_path(name: str) -> int | None:
    """The block of an original model's tensor: its name's first numeric component (`transformer.h.3.`)."""
    return next((int(p) for p in name.split(".") if p.isdigit()), None)


def _original_parts(module: torch.nn.Module, names: Iterable[str]) -> dict[str, str]:
    """Name -> part of an original model's tensors, by module path and the modules' order."""
    order = {path: i for i, (path, _) in enumerate(module.named_modules())}
    where = {n: order.get(n.rpartition(".")[0], 0) for n in names}
    blocks = [where[n] for n in where if _block_of_path(n) is not None]
    first = min(blocks, default=len(order))
    return {
        n: f"block {b}" if (b := _block_of_path(n)) is not None else ("embed" if where[n] < first else "head")
        for n in where
    }


def tensor_parts(f: Functional) -> dict[str, str]:
    """Tensor name -> part ("embed", "block <l>", "head") of one end of a path."""
    if f.canonical:
        return {n: f"block {layer}" if (layer := layer_of(n)) is not None else n.split(".")[0] for n in f.tensors}
    return _original_parts(f.module, f.tensors)


def ordered_parts(parts: dict[str, str]) -> list[str]:
    """The parts in forward order: the embedding, the blocks by index, the head (then any other)."""
    rank = lambda p: (0, 0) if p == "embed" else (1, int(p.split()[1])) if p.startswith("block ") else (2, p)  # noqa: E731
    return sorted(set(parts.values()), key=rank)


class PartPaths:
    """The two ends of an alignment on the evaluator's device, and the loss at a point where only some
    parts are interpolated."""

    def __init__(self, evaluator: Evaluator, alignment: Alignment):
        self.evaluator, self.circuits = evaluator, tuple(alignment.circuits)
        self.ends = [Functional(alignment.reference, evaluator.device), Functional(alignment.model, evaluator.device)]
        if self.ends[0].canonical != self.ends[1].canonical:
            raise TypeError("the two ends of a path must both be canonical or both be the original models")
        self.part_of = tensor_parts(self.ends[0])
        self.parts = ordered_parts(self.part_of)
        self._own: dict[str, float] = {}

    def _names(self, parts: Iterable[str]) -> list[str]:
        chosen = set(parts)
        unknown = chosen - set(self.parts)
        if unknown:
            raise ValueError(f"parts {sorted(unknown)} are not parts of the model: choose from {self.parts}")
        return [n for n, p in self.part_of.items() if p in chosen]

    def loss(self, parts: Iterable[str], lam: float, held: str = "a") -> float:
        """Mean loss at lam * A + (1 - lam) * B on `parts`' tensors, the others held at `held`'s."""
        if held not in HELD:
            raise ValueError(f"held={held!r} is not one of {HELD}")
        names, weights = self._names(parts), [lam, 1.0 - lam]
        fa, fb = self.ends
        hold = fa if held == "a" else fb
        if (held == "a" and lam == 1.0) or (held == "b" and lam == 0.0) or not names:
            return self._endpoint(held)  # every tensor is the held end's own
        every = len(names) == len(self.part_of)  # the straight line's own point
        ends = [{n: f.tensors[n] for n in names} for f in self.ends]
        with torch.inference_mode():
            if fa.canonical:
                merged = merge_params(ends, weights, self.circuits)
                config = merge_configs([fa.config, fb.config], weights) if every else hold.config
            else:
                merged, config = interpolate_state_dicts(ends, weights), None
        params: dict[str, Tensor] = {**hold.tensors, **merged}
        return self.evaluator._metrics(lambda x: fa.forward(params, x, config))[0]

    def _endpoint(self, held: str) -> float:
        if held not in self._own:
            f = self.ends[HELD.index(held)]
            self._own[held] = self.evaluator._metrics(lambda x: f.forward(f.tensors, x))[0]
        return self._own[held]


def _curves(paths: PartPaths, groups: list[list[str]], lambdas: list[float], bar: Any) -> dict[str, Any]:
    """Per held end: each group's loss along lambda and its barrier."""
    out = {}
    for held in HELD:
        losses = []
        for group in groups:
            row = []
            for lam in lambdas:
                row.append(paths.loss(group, lam, held))
                bar.update(1)
            losses.append(row)
        out[f"held_at_{held}"] = {"barrier": [barrier(lambdas, row) for row in losses], "loss": losses}
    return out


def layerwise_barriers(
    evaluator: Evaluator,
    alignment: Alignment,
    lambdas: Sequence[float],
    cumulative: bool = False,
    desc: str = "layer-wise",
) -> dict[str, Any]:
    """{"parts", "lambdas", "evaluations", "held_at_a": {"barrier": [per part], "loss": [per part [per
    lambda]]}, "held_at_b": ..., "cumulative": None or the same for parts 0..l ("held_at_a", "held_at_b")}:
    each part interpolated alone, the rest held at A (or B). Costs parts x lambdas x 2 evaluations of the
    split (twice that with `cumulative`), less the points that are an endpoint."""
    lambdas = checked_lambdas(lambdas)
    paths = PartPaths(evaluator, alignment)
    parts = paths.parts
    singles = [[p] for p in parts]
    prefixes = [parts[: i + 1] for i in range(len(parts))] if cumulative else []
    points = 2 * len(lambdas) * (len(singles) + len(prefixes))
    log.info("%s: %d parts x %d lambdas x 2 held ends%s = %d points", desc, len(parts), len(lambdas),
             " (and cumulative)" if cumulative else "", points)  # fmt: skip
    with tqdm(total=points, desc=desc, disable=not evaluator.progress, leave=False) as bar:
        record = {"parts": parts, "lambdas": lambdas, "evaluations": points, **_curves(paths, singles, lambdas, bar)}
        record["cumulative"] = _curves(paths, prefixes, lambdas, bar) if cumulative else None
    return record


def evaluate_layerwise(
    model_a: torch.nn.Module | Alignment,
    model_b: torch.nn.Module | None,
    loader: Iterable,
    lambdas: Sequence[float],
    task: str = "classification",
    circuits: Sequence[str] = (),
    cumulative: bool = False,
    progress: bool = True,
    **options,
) -> dict[str, Any]:
    """layerwise_barriers over `loader` for two models (or an Alignment as A and None as B)."""
    alignment = model_a if isinstance(model_a, Alignment) else Alignment(model_a, model_b, circuits=tuple(circuits))
    return layerwise_barriers(Evaluator(loader, task, progress=progress, **options), alignment, lambdas, cumulative)
