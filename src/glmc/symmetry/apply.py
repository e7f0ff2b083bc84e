"""apply(transform, model): the only code that moves weights between parameterisations."""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from glmc.host_memory import trim_heap
from glmc.models.canonical import CanonicalTransformer
from glmc.models.families.roles import layer_of
from glmc.symmetry.groups import Diagonal, Element, Permutation, SemiPermutation, SignedPermutation
from glmc.symmetry.spec import Axis, Space, SymmetrySpec
from glmc.symmetry.transform import Transform


def _gather_per_head(t: Tensor, ax: Axis, index: Tensor) -> Tensor:
    """One permutation per head: index (heads, n) gathers along ax.axis within each head."""
    x = t.movedim((ax.head_axis, ax.axis), (0, 1))
    index = index.reshape(*index.shape, *[1] * (x.dim() - 2)).expand(-1, -1, *x.shape[2:])
    return x.gather(1, index).movedim((0, 1), (ax.head_axis, ax.axis))


def _scale(t: Tensor, ax: Axis, scale: Tensor) -> Tensor:
    """t times `scale` along ax.axis; a (heads, n) scale one row per entry of ax.head_axis."""
    shape = [1] * t.dim()
    shape[ax.axis] = scale.shape[-1]
    if scale.dim() == 2:
        shape[ax.head_axis] = scale.shape[0]
        scale = scale if ax.head_axis < ax.axis else scale.T
    return t * scale.reshape(shape)


def _gather(t: Tensor, ax: Axis, index: Tensor, scale: Tensor | None) -> Tensor:
    if index.dim() == 2:
        return _gather_per_head(t, ax, index)
    n = t.shape[ax.axis] - ax.extra
    if ax.extra:  # the constant-1 coordinate stays where it is
        index = torch.cat([index, torch.arange(n, n + ax.extra, device=index.device)])
    out = t.index_select(ax.axis, index)
    return out if scale is None else _scale(out, ax, scale)


def contract(t: Tensor, m: Tensor, ax: Axis) -> Tensor:
    """new[..., i, ...] = sum_j m[i, j] t[..., j, ...] along ax.axis (per head if ax.head_axis)."""
    src = (ax.axis,) if ax.head_axis is None else (ax.head_axis, ax.axis)
    dst = (-1,) if ax.head_axis is None else (0, -1)
    x = t.movedim(src, dst)
    n = m.shape[-1]
    main, rest = x[..., :n], x[..., n:]
    if ax.head_axis is None:
        y = main @ m.T
    else:  # batched per head: flatten the axes in between
        y = (main.reshape(len(m), -1, n) @ m.transpose(-1, -2)).reshape(*main.shape[:-1], m.shape[-2])
    if rest.shape[-1]:  # a constant coordinate rides along (not copied where there is none)
        y = torch.cat([y, rest], -1)
    return y.movedim(dst, src)


def _check_size(t: Tensor, g: Element, ax: Axis, space: Space) -> None:
    n = t.shape[ax.axis] - ax.extra
    if g.size != n:
        raise ValueError(f"{space.name}: {g.kind} of size {g.size} acts on {ax.param} axis {ax.axis} of size {n}")
    if ax.head_axis is not None and getattr(g, "heads", None) != t.shape[ax.head_axis]:
        heads = getattr(g, "heads", "no")
        raise ValueError(f"{space.name}: {g.kind} with {heads} per-head elements for {t.shape[ax.head_axis]} heads")


def _act(g: Element, t: Tensor, ax: Axis, space: Space) -> Tensor:
    _check_size(t, g, ax, space)
    if isinstance(g, Permutation):
        return _gather(t, ax, g.perm, None)
    if isinstance(g, SignedPermutation):  # a gain moves with its coordinate and keeps its sign
        signs = None if ax.gain else torch.cat([g.signs, g.signs.new_ones(ax.extra)])
        return _gather(t, ax, g.perm, signs)
    if isinstance(g, SemiPermutation):
        return _gather(t, ax, g.src, g.weight if ax.side == space.shares_on else None)
    if isinstance(g, Diagonal):
        return _scale(t, ax, g.scales if ax.side == "out" else 1 / g.scales)
    return contract(t, g.forward() if ax.side == "out" else g.contra(), ax)


def apply_params(
    transform: Transform, spec: SymmetrySpec, params: dict[str, Tensor], strict: bool = True
) -> dict[str, Tensor]:
    """Functional apply on canonical params (differentiable; new tensors, inputs untouched), spaces in spec
    order. strict: each element's class must be one the spec lists (False: tests of other classes)."""
    unknown = set(transform) - set(spec.spaces)
    if unknown:
        hint = " (absorbed in circuit form)" if unknown & set(spec.absorbed) else ""
        raise KeyError(f"transform names spaces the model does not have: {sorted(unknown)}{hint}")
    out = dict(params)
    for space in spec:
        g = transform.get(space.name)
        if g is None:
            continue
        if strict and g.kind not in space.classes:
            raise ValueError(f"{g.kind} is not a symmetry of {space.name}; allowed: {space.classes}")
        if strict and space.rotary_dims is not None and getattr(g, "rotary_dims", None) != space.rotary_dims:
            raise ValueError(
                f"a {g.kind} rotating {getattr(g, 'rotary_dims', None)} dims is not a symmetry of {space.name}, "
                f"whose heads rotate their first {space.rotary_dims}"
            )
        ref = out[space.acts_on[0].param]
        g = g.to(ref.device, ref.dtype)
        for ax in space.acts_on:
            out[ax.param] = _act(g, out[ax.param], ax, space)
    return out


# elements of a tensor outside the layers (an embedding, a language head) transformed in float64 at a time:
# a large vocabulary's rows go through in chunks, never the whole matrix in float64 twice over
ROWS_AT_A_TIME = 1 << 22


def _row_axes_free(part: SymmetrySpec, name: str) -> bool:
    """Whether no space of `part` acts along axis 0 of tensor `name` (its rows can be transformed apart)."""
    return all(0 not in (ax.axis, ax.head_axis) for space in part for ax in space.acts_on if ax.param == name)


def _apply_tensor(elements: Transform, part: SymmetrySpec, t: Tensor, name: str, strict: bool, into: Tensor | None):
    """One tensor transformed in float64 and cast back (its spaces restricted to it: the same operations on
    each element as the whole group's); a large one whose rows no space mixes (the vocabulary's) a chunk of
    rows at a time, each written into `into` (a new tensor where None; `t` itself in place)."""
    if t.numel() <= ROWS_AT_A_TIME or t.dim() < 2 or not _row_axes_free(part, name):
        return apply_params(elements, part, {name: t.double()}, strict)[name].to(t.dtype)
    rows = max(1, ROWS_AT_A_TIME // (t.numel() // t.shape[0]))
    out = torch.empty_like(t) if into is None else into  # the rows are never held twice
    for i in range(0, t.shape[0], rows):
        out[i : i + rows] = apply_params(elements, part, {name: t[i : i + rows].double()}, strict)[name]
    return out


@torch.no_grad()
def apply(
    transform: Transform, model: CanonicalTransformer, strict: bool = True, in_place: bool = False
) -> CanonicalTransformer:
    """A new model computing the same function (for valid transforms), in float64 cast back; the input
    is not modified (`in_place`: it is the model returned, each group's tensors replaced as they are done,
    so a large model is never held twice: a large vocabulary's rows are written back into its own tensor).
    config.norm_dim is kept, which keeps rectangular residual maps exact. One tensor at a time (a large one's
    rows in chunks): the same operations on each element, in the same order, while only that tensor is held
    in float64 (a whole model twice over in float64 was three times its size)."""
    spec = SymmetrySpec.from_model(model)
    original = model.params()
    unknown = set(transform) - set(spec.spaces)
    if unknown:  # named here: a group's restricted spec would not see them
        apply_params(transform, spec, {}, strict)
    groups: dict[int | str, list[str]] = {}
    for name in original:
        layer = layer_of(name)
        groups.setdefault(name if layer is None else layer, []).append(name)
    new: dict[str, Tensor] = {}
    for names in groups.values():
        part = spec.restricted_to(set(names))
        elements = Transform({k: g for k, g in transform.items() if k in part.spaces})
        for name in names:  # one tensor at a time: only it is held in float64
            alone = part.restricted_to({name})
            mine = Transform({k: g for k, g in elements.items() if k in alone.spaces})
            t = original[name]
            done = _apply_tensor(mine, alone, t, name, strict, t if in_place else None)
            if in_place:
                if done is not t:
                    t.data = done
            else:
                new[name] = done
        if in_place:  # the group's freed float64 temporaries go back before the next group's are made
            trim_heap()
    if in_place:
        return model
    return CanonicalTransformer(dataclasses.replace(model.config), {k: new[k] for k in original}, copy=False)


def apply_dense(matrices: dict[str, Tensor], spec: SymmetrySpec, params: dict[str, Tensor]) -> dict[str, Tensor]:
    """apply_params for elements given as dense (m, n) matrices M, differentiable in M (learned matching's
    relaxed matrices). Readers get M too, its inverse transpose for orthonormal columns. No per-head spaces."""
    unknown = set(matrices) - set(spec.spaces)
    if unknown:
        raise KeyError(f"matrices name spaces the model does not have: {sorted(unknown)}")
    out = dict(params)
    for space in spec:
        m = matrices.get(space.name)
        if m is None:
            continue
        if space.heads is not None:
            raise ValueError(f"{space.name}: per-head spaces are not supported by apply_dense")
        for ax in space.acts_on:
            t = out[ax.param]
            if m.shape[-1] != t.shape[ax.axis] - ax.extra:
                raise ValueError(
                    f"{space.name}: a {tuple(m.shape)} matrix acts on {ax.param} axis {ax.axis} "
                    f"of size {t.shape[ax.axis] - ax.extra}"
                )
            out[ax.param] = contract(t, m.to(t.dtype), ax)
    return out
