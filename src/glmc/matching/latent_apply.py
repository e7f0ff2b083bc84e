"""T(theta_B) from learned matching's latents in few kernels, with the same values and gradients as
apply_dense on their straight-through matrices: B's residual-side tensors are stacked once as rows of one
matrix, so the residual map is one product per step; hard permutations move rows by index, their backward
still giving the straight-through gradient; soft (Sinkhorn) matrices are contracted densely.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from glmc.symmetry import SymmetrySpec
from glmc.symmetry.apply import contract
from glmc.symmetry.spec import Axis


class _PermuteAlong(torch.autograd.Function):
    """out = P t along `axis` for the hard permutation P of `latent` (given as its index), the
    latent's gradient being dL/dP (straight-through); `extra` trailing entries stay in place."""

    @staticmethod
    def forward(ctx, latent: Tensor, t: Tensor, perm: Tensor, axis: int, extra: int) -> Tensor:
        index = perm if not extra else torch.cat([perm, torch.arange(len(perm), len(perm) + extra, device=perm.device)])
        ctx.save_for_backward(t, index)
        ctx.axis, ctx.n = axis, len(perm)
        return t.index_select(axis, index)

    @staticmethod
    def backward(ctx, grad: Tensor):
        t, index = ctx.saved_tensors
        axis, n = ctx.axis, ctx.n
        grad_latent = grad_t = None
        if ctx.needs_input_grad[0]:
            g = grad.movedim(axis, 0)[:n].reshape(n, -1)
            grad_latent = g @ t.movedim(axis, 0)[:n].reshape(n, -1).T
        if ctx.needs_input_grad[1]:  # rows go back where they came from
            grad_t = torch.zeros_like(t).index_copy_(axis, index, grad)
        return grad_latent, grad_t, None, None, None


def permute_along(latent: Tensor, t: Tensor, perm: Tensor, ax: Axis) -> Tensor:
    return _PermuteAlong.apply(latent, t, perm, ax.axis, ax.extra)


@dataclass
class _Rows:
    """Where one tensor's residual axis lives in the stacked matrix X."""

    param: str
    axis: int
    start: int
    stop: int
    moved_shape: tuple[int, ...]  # the tensor with its residual axis last, the extra entries dropped
    rest: Tensor | None  # the extra trailing entries along that axis (left alone by the map)


class LatentApplier:
    """apply_dense(matrices, spec, params) for B's fixed params, spaces without per-head elements: per
    space a dense matrix, or (latent, hard index) for straight-through permutations. stack_residual: lay
    out the residual rows once for a dense residual matrix."""

    def __init__(self, spec: SymmetrySpec, params: dict[str, Tensor], spaces: list[str], stack_residual: bool = True):
        self.spec, self.spaces = spec, [s.name for s in spec if s.name in spaces]
        self.params = dict(params)
        self.rows: list[_Rows] = []
        residual = spec.spaces.get("residual")
        self.stacked: Tensor | None = None
        if residual is not None and "residual" in self.spaces and stack_residual:
            blocks, start = [], 0
            for ax in residual.acts_on:
                if ax.head_axis is not None:
                    raise ValueError("residual: per-head axes are not supported")
                x = params[ax.param].movedim(ax.axis, -1)
                n = x.shape[-1] - ax.extra
                main, rest = x[..., :n], (x[..., n:] if ax.extra else None)
                blocks.append(main.reshape(-1, n))
                stop = start + blocks[-1].shape[0]
                self.rows.append(_Rows(ax.param, ax.axis, start, stop, tuple(main.shape), rest))
                start = stop
            self.stacked = torch.cat(blocks).contiguous()

    def to(self, device: torch.device) -> LatentApplier:
        if self.stacked is not None and self.stacked.device != device:
            self.params = {k: v.to(device) for k, v in self.params.items()}
            self.stacked = self.stacked.to(device)
            for r in self.rows:
                r.rest = None if r.rest is None else r.rest.to(device)
        return self

    def __call__(self, elements: dict[str, Tensor | tuple[Tensor, Tensor]]) -> dict[str, Tensor]:
        out = dict(self.params)
        for name in self.spaces:
            g = elements.get(name)
            if g is None:
                continue
            space = self.spec.spaces[name]
            if name == "residual" and self.stacked is not None and not isinstance(g, tuple):
                y = self.stacked @ g.to(self.stacked.dtype).T
                # one split: its backward joins the pieces (a slice each would fill a zero matrix each)
                pieces = y.split([r.stop - r.start for r in self.rows])
                for r, piece in zip(self.rows, pieces):
                    t = piece.reshape(r.moved_shape)
                    if r.rest is not None:
                        t = torch.cat([t, r.rest], -1)
                    out[r.param] = t.movedim(-1, r.axis)
                continue
            for ax in space.acts_on:
                if ax.head_axis is not None:
                    raise ValueError(f"{name}: per-head spaces are not supported")
                t = out[ax.param]
                if isinstance(g, tuple):
                    out[ax.param] = permute_along(g[0], t, g[1], ax)
                else:
                    out[ax.param] = contract(t, g.to(t.dtype), ax)
        return out
