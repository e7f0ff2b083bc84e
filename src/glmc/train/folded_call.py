"""The shape of a kernel call folded under vmap (glmc.train.folded_attention, glmc.train.folded_experts): an
autograd.Function applied only inside vmap, whose `vmap` rule makes one call of the real kernel over all
members; autograd records that call and differentiates it, so the Function needs no backward of its own."""

from __future__ import annotations

import torch


class FoldedCall(torch.autograd.Function):
    """Subclasses give `forward` (the kernel call one member would make) and `vmap` (the folded call)."""

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("a folded call is differentiated through the call its vmap rule makes, under vmap only")
