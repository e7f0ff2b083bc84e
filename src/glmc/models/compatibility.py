"""Whether two canonical models can be aligned and interpolated, and a residual class with their family."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from glmc.models.canonical import CanonicalTransformer
from glmc.models.families import family_named
from glmc.models.families.base import layer_sizes


def residual_class_problem(family: Any, value: Any, key: str, where: str | None = None) -> str | None:
    """Why residual class `value`, set at `key`, is no symmetry of `family`: for the run config where `where`
    names the family there, else for glmc.align's argument; None where it is one."""
    if value is None or str(value) in ("none", "auto", *family.residual_classes):
        return None
    classes = ", ".join(family.residual_classes)
    if where is None:
        return (
            f"{key}={value} is not a symmetry of the {family.name} family's residual stream; allowed: {classes} "
            "(or leave it out: the widest is the default)"
        )
    return (
        f"{key}={value}: not a symmetry of {where}, whose residual stream admits {classes} only "
        f"({family.residual_note}); use symmetry=permutation or {key}=permutation"
    )


def _differences(a: CanonicalTransformer, b: CanonicalTransformer, equal_mlp: bool) -> Iterator[tuple[str, ...]]:
    """(what, value in b, value in a) for each property, in order of how fundamental it is."""
    ca, cb = a.config, b.config
    yield "is a {} model", cb.family, ca.family
    yield "is in {} form", cb.form, ca.form
    yield "has activation {}", cb.activation, ca.activation
    yield "has pooling {}", cb.pooling, ca.pooling
    yield "has causal={}", cb.causal, ca.causal
    yield "has {} layers", b.num_layers, a.num_layers
    yield "has width {}", b.width, a.width
    # the interpolated model normalises with A's settings: B's own must be the same, or lambda=0 is not B
    yield "has norm epsilon {}", cb.norm_eps, ca.norm_eps
    yield "normalises over {} dimensions", cb.norm_dim, ca.norm_dim
    pa, pb = a.params(), b.params()
    if ca.family != cb.family:
        return
    family = family_named(ca.family)
    yield from (
        (what, vb, va) for (what, vb), (_, va) in zip(family.input_properties(cb, pb), family.input_properties(ca, pa))
    )
    layout = family.layout(ca)
    sa, sb = layer_sizes(layout, pa, a.num_layers), layer_sizes(layout, pb, a.num_layers)
    for l in range(a.num_layers):
        yield f"has {{}} heads in layer {l}", sb["heads"][l], sa["heads"][l]
        if "qk" in sa:
            yield f"has query/key head dim {{}} in layer {l}", sb["qk"][l], sa["qk"][l]
        elif f"blocks.{l}.k_w" in pa:  # heads normed over their dims (qk_norm): no space pads them
            dims = (pb[f"blocks.{l}.k_w"].shape[-2], pa[f"blocks.{l}.k_w"].shape[-2])
            yield f"has query/key head dim {{}} in layer {l} (head_dim)", *dims
        if "vo" in sa:
            yield f"has value head dim {{}} in layer {l}", sb["vo"][l], sa["vo"][l]
        if equal_mlp and "mlp" in sa:
            yield f"has MLP width {{}} in layer {l}", sb["mlp"][l], sa["mlp"][l]
        for kind, what in (("experts", "experts"), ("expert_units", "units per expert")):
            if kind in sa:
                yield f"has {{}} {what} in layer {l}", sb[kind][l], sa[kind][l]


def check_compatible(a: CanonicalTransformer, b: CanonicalTransformer, equal_mlp: bool = True) -> None:
    """ValueError naming the first property in which `b` differs from `a` (`equal_mlp=False`: not MLP widths)."""
    for what, vb, va in _differences(a, b, equal_mlp):
        if vb != va:
            raise ValueError(
                f"model_a and model_b do not fit together: model_b {what.format(vb)}, model_a {what.format(va)}"
            )
