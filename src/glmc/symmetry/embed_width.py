"""Embedding a canonical Transformer into a wider one that computes exactly the same function.

The residual stream is mapped by U (M x m) with orthonormal columns (paper 001 §3.2.3, Appendix E):
writers W -> U W, readers W -> W U^T, as `apply` does with an Orthogonal element. The RMS reference
width then becomes N (default M), so that the result can be matched and interpolated with a model
trained at width M (paper 001 Fig. 3c). With n = config.norm_dim and |U x| = |x|,

  sqrt(|U x|^2 / N + eps n / N) = sqrt(n / N) sqrt(|x|^2 / n + eps),

so eps -> eps n / N and every weight that reads the normalised stream (q_w, k_w, v_w, in_w, head.w;
the residual block of qk and ov in circuit form) is scaled by sqrt(n / N). Biases are added after
the product and stay as they are.

The RMS norm also makes the stream's scale free: writers (every residual axis on the output side)
multiplied by s and eps by s^2 leave the function as it is. `stream_scale=s` applies it; with
s = sqrt(N / n) the embedded stream has the narrow stream's root mean square and eps is the narrow
model's own (`match_widths(..., stream="rms")`), so a wide model and an embedded narrow one that
were trained alike carry streams of one size. The scale sets how fast the wide model's writers take
over along a path between them; on the digits ViTs the kept norm (s = 1) gave the lower barriers
(docs/experiments.md, "Many models and different widths").

Heads, head dimensions and MLP units are padded with zeros: padded heads and units write nothing
through their zero output weights, whatever the activation gives at 0; zero query/key dimensions add
0 to the scores; zero value dimensions meet zero columns of o_w. Padding goes at the end; a matcher
permutes it into place.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch
from torch import Tensor

from glmc.choices import EmbedStream
from glmc.models.canonical import CanonicalTransformer
from glmc.models.families import family_named
from glmc.models.families.base import layer_sizes as family_layer_sizes
from glmc.models.families.roles import HEAD_HIDDEN
from glmc.symmetry.apply import apply_params
from glmc.symmetry.groups import Orthogonal, random_orthogonal
from glmc.symmetry.spec import SymmetrySpec
from glmc.symmetry.transform import Transform

PerLayer = Sequence[int] | int | None
# the per-layer spaces and the names embed_width's sizes have for them
SIZE_NAMES = {"heads": "heads", "qk": "qk_dim", "vo": "vo_dim", "mlp": "mlp"}


def layer_sizes(model: CanonicalTransformer) -> dict[str, list[int]]:
    """Per layer: heads, qk_dim and vo_dim (factored form only) and mlp units."""
    layout = family_named(model.config.family).layout(model.config)
    sizes = family_layer_sizes(layout, model.params(), model.num_layers)
    return {SIZE_NAMES[kind]: values for kind, values in sizes.items()}


def _per_layer(name: str, value: PerLayer, current: list[int]) -> list[int]:
    if value is None:
        return list(current)
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value] * len(current)
    value = list(value)
    if len(value) != len(current):
        raise ValueError(f"{name}={value}: {len(value)} entries for {len(current)} layers")
    for l, (v, c) in enumerate(zip(value, current)):
        if not isinstance(v, int) or isinstance(v, bool) or v < c:
            raise ValueError(f"{name}[{l}]={v!r}: must be an int of at least the model's {c}")
    return value


def _pad(t: Tensor, axis: int, size: int) -> Tensor:
    """t with zeros appended along axis up to size."""
    extra = size - t.shape[axis]
    if extra == 0:
        return t
    shape = list(t.shape)
    shape[axis] = extra
    return torch.cat([t, t.new_zeros(shape)], axis)


def _residual_map(residual_map: Tensor | None, width: int, m: int, generator) -> Tensor:
    if residual_map is None:
        return random_orthogonal(width, m, generator, dtype=torch.float64)
    u = residual_map.detach().double().cpu()
    if tuple(u.shape) != (width, m):
        raise ValueError(f"residual_map has shape {tuple(u.shape)}, expected (width, model width) = {(width, m)}")
    if not torch.allclose(u.T @ u, torch.eye(m, dtype=u.dtype), atol=1e-5):
        raise ValueError("residual_map must have orthonormal columns (U^T U = I)")
    return u


def _scale_readers(p: dict[str, Tensor], spec: SymmetrySpec, s: float) -> None:
    """Multiply every weight that reads the normalised stream by s along its residual axes, leaving
    alone the constant coordinate of circuits ([h; 1]^T QK [h; 1]); in place on the dict."""
    for axis in spec["residual"].acts_on:
        if axis.side != "in":
            continue
        t = p[axis.param]
        if axis.extra == 0:
            p[axis.param] = t * s
            continue
        t = t.clone()
        t.narrow(axis.axis, 0, t.shape[axis.axis] - axis.extra).mul_(s)
        p[axis.param] = t


@torch.no_grad()
def embed_width(
    model: CanonicalTransformer,
    width: int,
    heads: PerLayer = None,
    mlp: PerLayer = None,
    generator: torch.Generator | None = None,
    residual_map: Tensor | None = None,
    *,
    qk_dim: PerLayer = None,
    vo_dim: PerLayer = None,
    norm_dim: int | None = None,
    stream_scale: float = 1.0,
) -> CanonicalTransformer:
    """A model of residual width `width` computing exactly what `model` computes.

    heads, qk_dim, vo_dim, mlp: per-layer sizes (an int for every layer, a list per layer, None to
    keep), each at least the model's; qk_dim / vo_dim only in factored form. residual_map: the
    (width, model.width) map with orthonormal columns (default Haar-random from `generator`).
    norm_dim: the RMS reference width of the result (default `width`). stream_scale: the factor on
    every residual writer (eps scaled by its square). Runs in float64 and casts back to each
    tensor's dtype."""
    config = model.config
    m = model.width
    if not isinstance(width, int) or isinstance(width, bool) or width < m:
        raise ValueError(f"width={width!r}: must be an int of at least the model's width {m}")
    post = family_named(config.family).norm == "post"
    if post and (width > m or residual_map is not None or stream_scale != 1.0 or norm_dim not in (None, m)):
        raise ValueError(
            f"width={width}: a {config.family} model's stream is a LayerNorm's output, whose mean and variance "
            f"over the width change when the stream is embedded in more dimensions or rescaled; only its heads "
            f"and MLP widen (width {m}, no residual_map, stream_scale or norm_dim)"
        )
    norm_dim = width if norm_dim is None else norm_dim
    if not math.isfinite(stream_scale) or stream_scale <= 0:
        raise ValueError(f"stream_scale={stream_scale!r}: must be a positive finite number")
    if not isinstance(norm_dim, int) or isinstance(norm_dim, bool) or norm_dim < 1:
        raise ValueError(f"norm_dim={norm_dim!r}: must be a positive int")
    current = layer_sizes(model)
    if config.form == "circuit" and (qk_dim is not None or vo_dim is not None):
        raise ValueError("qk_dim / vo_dim: a circuit-form model has no head dimensions to pad")
    target = {"heads": _per_layer("heads", heads, current["heads"]), "mlp": _per_layer("mlp", mlp, current["mlp"])}
    if config.form == "factored":
        target["qk_dim"] = _per_layer("qk_dim", qk_dim, current["qk_dim"])
        target["vo_dim"] = _per_layer("vo_dim", vo_dim, current["vo_dim"])
    u = _residual_map(residual_map, width, m, generator)

    original = model.params()
    p = {k: v.detach().double() for k, v in original.items()}
    spec = SymmetrySpec.from_params(config, p)
    if not post:  # a post-norm stream stays as it is
        p = apply_params(Transform({"residual": Orthogonal(u)}), spec, p)
        _scale_readers(p, spec, math.sqrt(config.norm_dim / norm_dim))
    if stream_scale != 1.0:
        for axis in spec["residual"].acts_on:
            if axis.side == "out":
                p[axis.param] = p[axis.param] * stream_scale

    # padding goes at the end of every head, head-dimension and unit axis
    for space in spec:
        if space.kind in ("residual", HEAD_HIDDEN):  # the stream is mapped above; a task head's hidden state stays
            continue
        size = target[SIZE_NAMES[space.kind]][space.layer]
        for axis in space.acts_on:
            p[axis.param] = _pad(p[axis.param], axis.axis, size)

    out = {k: v.to(original[k].dtype) for k, v in p.items()}
    factor = stream_scale**2 * config.norm_dim / norm_dim
    eps = config.norm_eps if math.isclose(factor, 1.0, rel_tol=1e-12) else config.norm_eps * factor
    new_config = dataclasses.replace(config, norm_dim=norm_dim, norm_eps=eps)
    return CanonicalTransformer(new_config, out)


STREAM_CHOICES = tuple(s.value for s in EmbedStream)  # the config's embed_stream values
_SAME_CONFIG = ("family", "form", "activation", "causal", "pooling", "patch_size", "num_channels")


@torch.no_grad()
def match_widths(
    wide: CanonicalTransformer,
    narrow: CanonicalTransformer,
    generator: torch.Generator | None = None,
    stream: str = "keep",
) -> CanonicalTransformer:
    """`narrow` embedded to exactly the parameter shapes and norm_dim of `wide`, so that any matcher
    for equal shapes can align it to `wide`.

    stream="keep": the stream keeps its size (|U x| = |x|) and the result's norm_eps is narrow's
    rescaled, narrow.config.norm_eps * n / N, which in general differs from wide's: a path between the
    two interpolates it with the weights (glmc.interpolation.merge_configs), so it ends at each. stream="rms":
    the writers are scaled by sqrt(N / n), so the stream keeps its root mean square and norm_eps
    stays narrow's own."""
    if stream not in STREAM_CHOICES:
        raise ValueError(f"stream={stream!r} is not one of {STREAM_CHOICES}")
    for key in _SAME_CONFIG:
        a, b = getattr(wide.config, key), getattr(narrow.config, key)
        if a != b:
            raise ValueError(f"config.{key} differs: wide {a!r}, narrow {b!r}")
    if wide.num_layers != narrow.num_layers:
        raise ValueError(f"layers differ: wide {wide.num_layers}, narrow {narrow.num_layers}")
    pw, pn = wide.params(), narrow.params()
    # every axis that no symmetry space acts on: vocabulary, positions, classes, patches
    spec = SymmetrySpec.from_model(wide)
    moved = {(a.param, a.axis) for space in spec for a in space.acts_on}
    for name, t in pw.items():
        axes = [i for i in range(t.dim()) if (name, i) not in moved]
        a, b = [t.shape[i] for i in axes], [pn[name].shape[i] for i in axes]
        if a != b:
            raise ValueError(f"{name}: narrow has sizes {b}, wide {a} (vocabulary, positions or classes)")
    if narrow.width > wide.width:
        raise ValueError(f"width: narrow {narrow.width} is larger than wide {wide.width}")
    sizes_w, sizes_n = layer_sizes(wide), layer_sizes(narrow)
    for key, values in sizes_w.items():
        for l, (a, b) in enumerate(zip(values, sizes_n[key])):
            if b > a:
                raise ValueError(f"{key}: narrow has {b} in layer {l}, larger than wide's {a}")
    extra = {"qk_dim": sizes_w["qk_dim"], "vo_dim": sizes_w["vo_dim"]} if "qk_dim" in sizes_w else {}
    out = embed_width(
        narrow,
        wide.width,
        heads=sizes_w["heads"],
        mlp=sizes_w["mlp"],
        generator=generator,
        norm_dim=wide.config.norm_dim,
        stream_scale=math.sqrt(wide.config.norm_dim / narrow.config.norm_dim) if stream == "rms" else 1.0,
        **extra,
    )
    po = out.params()
    if list(po) != list(pw) or any(po[k].shape != pw[k].shape for k in pw):
        raise RuntimeError("match_widths: parameter shapes differ after embedding")
    return out


def same_shapes(a: CanonicalTransformer, b: CanonicalTransformer) -> bool:
    """Whether two canonical models have the same parameters with the same shapes."""
    pa, pb = a.params(), b.params()
    return pa.keys() == pb.keys() and all(pa[k].shape == pb[k].shape for k in pa)
