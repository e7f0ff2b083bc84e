"""Assignment problems of weight matching: one Hungarian solve per layer (side by side where that pays),
key/value groups of grouped attention, and layers whose last assignment a certificate still proves
optimal (the certificates themselves live in glmc.matching.engine.warm_assignment)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import torch
from torch import Tensor

from glmc.matching.engine.device_assignment import device_project
from glmc.matching.engine.warm_assignment import WarmAssignments
from glmc.symmetry import Permutation
from glmc.threads import one_thread

# the smallest MLP whose layers' assignments are solved side by side (measured in matching_speed.py: at
# 512 units a thread pool costs what it saves, at 2,048 it saves a fifth of the MLP step)
PARALLEL_UNITS = 1024


def projected(similarity: Callable[[int], Tensor], layer: int) -> Permutation:
    """The assignment maximising similarity(layer) (Permutation.project; on the device where that wins)."""
    return device_project(similarity(layer))


def assign_layers(
    solve: Callable[[int], Permutation], layers: Sequence[int], threads: int | None = None
) -> list[Permutation]:
    """Per layer, solve(layer) (an assignment, typically Permutation.project of a similarity). The
    layers' problems are independent and SciPy's Hungarian solver releases the GIL, so `threads`
    layers (None: torch's thread count) are built and solved at once, each on one torch thread (threads
    of their own would outnumber the cores); only that many similarity matrices are held at a time."""
    threads = torch.get_num_threads() if threads is None else threads
    if threads <= 1 or len(layers) < 2:
        return [solve(layer) for layer in layers]
    with one_thread(), ThreadPoolExecutor(min(threads, len(layers))) as pool:
        return list(pool.map(solve, layers))


def warm_layers(
    warm: WarmAssignments,
    reference: Tensor,
    similarity: Callable[[int], Tensor],
    layers: Sequence[int],
    threads: int | None = None,
) -> list[Permutation]:
    """assign_layers with the assignments `warm` keeps: the layers still inside their certified radius
    at map `reference` first (cheap: no threads for those), then the rest solved side by side."""
    kept = {layer: warm.kept(reference, layer) for layer in layers}
    rest = [layer for layer in layers if kept[layer] is None]
    fresh = dict(zip(rest, assign_layers(partial(warm.solve, reference, similarity), rest, threads)))
    return [fresh[layer] if kept[layer] is None else kept[layer] for layer in layers]


def group_assignment(cost: Tensor, groups: int) -> tuple[Permutation, Permutation]:
    """Key/value groups and, within each matched pair of groups, their query heads, from a (H, H) cost
    between query heads (H = groups * G, head k * G + g in group k): a pair of groups costs the best
    assignment of their query heads (Hungarian on G x G), and groups are assigned on those costs.
    Returns (heads: groups, qheads: one permutation per new group)."""
    size = cost.shape[0] // groups
    blocks = cost.reshape(groups, size, groups, size).permute(0, 2, 1, 3)  # (K_A, K_B, G, G)
    inner = [[Permutation.project(-blocks[i, j]).perm for j in range(groups)] for i in range(groups)]
    rows = torch.arange(size, device=cost.device)
    # float32 as before: the group costs are compared at the precision they always were
    pair = lambda i, j: blocks[i, j][rows, inner[i][j]].sum()  # noqa: E731
    pair_cost = torch.stack([torch.stack([pair(i, j) for j in range(groups)]) for i in range(groups)]).float()
    outer = Permutation.project(-pair_cost).perm
    return Permutation(outer), Permutation(torch.stack([inner[i][int(outer[i])] for i in range(groups)]))
