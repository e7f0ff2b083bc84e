"""The shape of a kernel call folded under vmap (glmc.train.folded_attention, folded_linear, folded_experts): an
autograd.Function applied only inside vmap, whose `vmap` rule makes one call of the real kernel over all
members; autograd records that call and differentiates it, so the Function needs no backward of its own. A
FoldingMode routes the model's calls to the folds while the ensemble's vmapped call runs."""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode


def in_front(t: torch.Tensor, dim: int | None, members: int) -> torch.Tensor:
    """`t` with the member axis (`dim`, as a vmap rule's in_dims give it; None: one tensor for all) in front."""
    return t.movedim(dim, 0) if dim is not None else t.expand(members, *t.shape)


class FoldedCall(torch.autograd.Function):
    """Subclasses give `forward` (the kernel call one member would make) and `vmap` (the folded call)."""

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("a folded call is differentiated through the call its vmap rule makes, under vmap only")


class FoldingMode(TorchFunctionMode):
    """While entered, routes each function in `routes` (function -> its folded version) through its fold;
    every other call passes through."""

    routes: dict = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return self.routes.get(func, func)(*args, **(kwargs or {}))
