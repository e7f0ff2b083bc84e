"""Linear layers under vmap as one batched product with the bias inside it, whose backward writes each
weight's gradient in the weight's own layout. vmap's own rule for F.linear with stacked weights is a
product against the transposed weights, then a separate pass adding the bias; its backward computes the
transposed weights' gradient, which the stacked parameter (stored untransposed) then copies into its own
layout, a full pass over every weight each step. A single model's linear avoids both (the bias enters the
product, and its backward computes the gradient in the weight's layout); folded, the members do too.
`FoldedLinear()` is a mode that routes torch.nn.functional.linear with stacked weights through the fold
while it is entered; everything else passes through."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from glmc.train.folded_call import FoldedCall, FoldingMode, in_front


class _StackedLinear(torch.autograd.Function):
    """(K, N, in) rows, (K, out, in) weights, (K, out) bias or None -> (K, N, out), each member's rows times
    its own weights; the gradients in the inputs' layouts."""

    @staticmethod
    def forward(ctx, rows, weight, bias):
        ctx.save_for_backward(rows, weight)
        ctx.has_bias = bias is not None
        if bias is None:
            return torch.bmm(rows, weight.transpose(1, 2))
        return torch.baddbmm(bias.unsqueeze(1), rows, weight.transpose(1, 2))

    @staticmethod
    def backward(ctx, grad):
        rows, weight = ctx.saved_tensors
        need_rows, need_weight, need_bias = ctx.needs_input_grad
        grad_rows = torch.bmm(grad, weight) if need_rows else None
        grad_weight = torch.bmm(grad.transpose(1, 2), rows) if need_weight else None
        grad_bias = grad.sum(1) if need_bias and ctx.has_bias else None
        return grad_rows, grad_weight, grad_bias


class _Folded(FoldedCall):
    @staticmethod
    def forward(x, weight, bias):
        return F.linear(x, weight, bias)

    @staticmethod
    def vmap(info, in_dims, x, weight, bias):
        members = info.batch_size
        x = in_front(x, in_dims[0], members)
        if in_dims[1] is None:  # one weight for all members: a plain linear over their rows
            bias = None if bias is None else in_front(bias, in_dims[2], members).unsqueeze(-2)
            out = F.linear(x.reshape(members, -1, x.shape[-1]), weight)
            out = out if bias is None else out + bias
            return out.view(*x.shape[:-1], out.shape[-1]), 0
        weight = in_front(weight, in_dims[1], members)
        bias = None if bias is None else in_front(bias, in_dims[2], members)
        out = _StackedLinear.apply(x.reshape(members, -1, x.shape[-1]), weight, bias)
        return out.view(*x.shape[:-1], out.shape[-1]), 0


def _linear(input, weight, bias=None):  # F.linear's own argument names, for keyword calls
    batched = torch._C._functorch.is_batchedtensor
    plain = (
        not (batched(input) or batched(weight))  # outside vmap
        or weight.ndim != 2
        or input.ndim < 1
        or (bias is not None and bias.ndim != 1)
        or input.dtype != weight.dtype
        or torch.is_autocast_enabled(input.device.type)  # the casts autocast gives the plain call
    )
    if plain:
        return F.linear(input, weight, bias)
    return _Folded.apply(input, weight, bias)


class FoldedLinear(FoldingMode):
    routes = {F.linear: _linear}
