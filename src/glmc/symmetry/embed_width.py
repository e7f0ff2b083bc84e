"""Embedding a canonical Transformer into a wider one that computes exactly the same function.

The stream is mapped by U (M x m) with orthonormal columns (paper 001 §3.2.3, Appendix E) and the RMS
reference width becomes N: since sqrt(|U x|^2 / N + eps n / N) = sqrt(n / N) sqrt(|x|^2 / n + eps), eps
becomes eps n / N and every reader of the normalised stream is scaled by sqrt(n / N) (biases stay).
`stream_scale=s` multiplies the writers by s and eps by s^2 (the RMS norm makes the scale free); with
s = sqrt(N / n) (`match_widths(..., stream="rms")`) the stream keeps the narrow model's RMS and eps.
Heads, head dimensions and MLP units are padded with zeros at the end, which write or score nothing.
Rotary query/key pairs go to the wide pair of the same frequency and pass-through dims to the first wide
ones (refused, naming both layouts, where no wide pair has a narrow pair's frequency).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from glmc.choices import EmbedStream
from glmc.models.canonical import CanonicalTransformer
from glmc.models.families import family_named
from glmc.models.families.base import layer_sizes as family_layer_sizes
from glmc.models.families.roles import HEAD_HIDDEN
from glmc.models.rotary import rotating_dims, same_frequency_pairs
from glmc.symmetry.apply import apply_params
from glmc.symmetry.groups import Orthogonal, random_orthogonal
from glmc.symmetry.spec import SymmetrySpec
from glmc.symmetry.transform import Transform

PerLayer = Sequence[int] | int | None
# the per-layer spaces and embed_width's names for their sizes (a gated MLP's scales are per unit; a
# mixture's experts keep their count, each expert's units are padded as an MLP's)
SIZE_NAMES = {"heads": "heads", "qheads": "qheads", "qk": "qk_dim", "vo": "vo_dim", "mlp": "mlp", "mlp_scale": "mlp"}
SIZE_NAMES |= {"experts": "experts", "expert_units": "expert_units", "expert_scale": "expert_units"}


def layer_sizes(model: CanonicalTransformer) -> dict[str, list[int]]:
    """Per layer: heads (grouped-query attention: key/value groups), qheads (grouped-query only: the query
    heads of each group), qk_dim and vo_dim (factored form only), mlp units and, in a mixture of experts,
    experts and expert_units (each expert's)."""
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


def _placement(t: Tensor, axis: int, index: list[int], size: int) -> Tensor:
    """t's entries along axis at positions `index` of a zero tensor of `size` there."""
    shape = list(t.shape)
    shape[axis] = size
    out = t.new_zeros(shape)
    out.index_copy_(axis, torch.tensor(index, dtype=torch.long), t)
    return out


@dataclasses.dataclass(frozen=True)
class RotaryHead:
    """A query/key head's rotary layout: `size` dims, the first `rotating` turning as pairs (i, i +
    rotating/2) at theta^(-2i/freq_dim), the rest passing through."""

    size: int
    rotating: int
    freq_dim: int

    @classmethod
    def of(cls, config, size: int) -> RotaryHead:
        rotating = size if config.rotary_dims is None else config.rotary_dims
        return cls(size, rotating, rotating if config.rotary_freq_dim is None else config.rotary_freq_dim)

    def __str__(self) -> str:
        through = f", {self.size - self.rotating} passing through" if self.rotating < self.size else ""
        return f"{self.size} dims ({self.rotating} rotating at the frequencies of {self.freq_dim}{through})"

    def config_fields(self) -> dict[str, int | None]:
        """CanonicalConfig's rope_dim, rotary_dims and rotary_freq_dim for heads of this layout."""
        return {
            "rope_dim": self.size,
            "rotary_dims": None if self.rotating == self.size else self.rotating,
            "rotary_freq_dim": None if self.freq_dim == self.rotating else self.freq_dim,
        }


def _rotary_target(config, sizes: list[int], target: list[int], rotary_dims, rotary_freq_dim) -> RotaryHead:
    """The wide heads' layout: `rotary_dims` rotating (default: every dim where the model rotates every
    dim, else the model's count) at the frequencies of `rotary_freq_dim` (default: the model's own where
    the rotating dims stay, else rotary_dims)."""
    if len(set(sizes)) > 1 or len(set(target)) > 1 or config.rope_dim not in (None, sizes[0]):
        raise ValueError(
            f"qk_dim={target}: a rotary model's heads share one rotary layout (rope_dim {config.rope_dim}, "
            f"query/key dims {sizes}); give every layer the same qk_dim"
        )
    own, size = RotaryHead.of(config, sizes[0]), target[0]
    rotating = rotary_dims if rotary_dims is not None else (size if config.rotary_dims is None else own.rotating)
    freq_dim = (
        rotary_freq_dim if rotary_freq_dim is not None else (own.freq_dim if rotating == own.rotating else rotating)
    )
    if rotating % 2 or not 0 < rotating <= size or freq_dim not in (rotating - 1, rotating):
        raise ValueError(
            f"rotary_dims={rotating}, rotary_freq_dim={freq_dim}: the rotating dims are an even count of at most "
            f"qk_dim={size}, at the frequencies of that count or one less (Hugging Face's odd count)"
        )
    return RotaryHead(size, rotating, freq_dim)


def rotary_index(narrow: RotaryHead, wide: RotaryHead, scaling: dict | None) -> list[int]:
    """Where each query/key dim of a `narrow` head goes in a `wide` one: each rotary pair onto the wide pair
    of the same frequency, the pass-through dims onto the first wide ones. ValueError when a pair has no
    such partner or the pass-through dims do not fit."""
    half, wide_half = narrow.rotating // 2, wide.rotating // 2
    try:
        pairs = same_frequency_pairs(half, narrow.freq_dim, wide_half, wide.freq_dim, scaling)
    except ValueError as err:
        raise ValueError(f"the query/key heads of {narrow} do not embed into {wide}: {err}") from None
    through = narrow.size - narrow.rotating
    if through > wide.size - wide.rotating:
        raise ValueError(
            f"the query/key heads of {narrow} pass {through} dims through unrotated, more than the "
            f"{wide.size - wide.rotating} of {wide}"
        )
    return pairs + [wide_half + j for j in pairs] + list(range(wide.rotating, wide.rotating + through))


def _targets(model: CanonicalTransformer, heads, qheads, mlp, qk_dim, vo_dim, expert_units) -> dict[str, list[int]]:
    """Per-layer target sizes by embed_width's names, each checked against the model's."""
    current = layer_sizes(model)
    if expert_units is not None and "expert_units" not in current:
        raise ValueError(f"expert_units={expert_units}: a {model.config.family} model has no experts")
    if model.config.form == "circuit" and (qk_dim is not None or vo_dim is not None):
        raise ValueError("qk_dim / vo_dim: a circuit-form model has no head dimensions to pad")
    if qheads is not None and "qheads" not in current:
        raise ValueError(f"qheads={qheads}: a {model.config.family} model has no grouped query heads")
    given = {"heads": heads, "qheads": qheads, "mlp": mlp, "qk_dim": qk_dim, "vo_dim": vo_dim}
    given |= {"expert_units": expert_units, "experts": None}  # the experts keep their count (match_widths)
    target = {key: _per_layer(key, given[key], values) for key, values in current.items()}
    kind = family_named(model.config.family).attention_block()
    added = [key for key in ("heads", "qheads") if key in target and target[key] != current[key]]
    if added and "semi_permutation" not in kind.head_classes:  # added heads enter a norm over all heads
        raise ValueError(
            f"{added[0]}={given[added[0]]}: {kind.name} attention normalises all heads' queries together, so "
            "added heads change every head's queries; leave the heads as they are"
        )
    return target


def rotatable_stream(model: CanonicalTransformer) -> bool:
    """Whether the model's residual stream admits orthogonal maps (not post-norm or sandwich-normed)."""
    return "orthogonal" in SymmetrySpec.from_model(model)["residual"].classes


def _checked_stream(model, width, residual_map, stream_scale, norm_dim) -> int:
    """The result's norm_dim, after refusing a stream the model's norm cannot be embedded with."""
    config, m = model.config, model.width
    if not isinstance(width, int) or isinstance(width, bool) or width < m:
        raise ValueError(f"width={width!r}: must be an int of at least the model's width {m}")
    fixed = not rotatable_stream(model)
    if fixed and (width > m or residual_map is not None or stream_scale != 1.0 or norm_dim not in (None, m)):
        raise ValueError(
            f"width={width}: a {config.family} model's stream admits permutations only "
            f"({family_named(config.family).residual_note}), and norms over the width change when the stream is "
            f"embedded in more dimensions or rescaled; only its heads and MLP widen (width {m}, no residual_map, "
            "stream_scale or norm_dim)"
        )
    norm_dim = width if norm_dim is None else norm_dim
    if not math.isfinite(stream_scale) or stream_scale <= 0:
        raise ValueError(f"stream_scale={stream_scale!r}: must be a positive finite number")
    if not isinstance(norm_dim, int) or isinstance(norm_dim, bool) or norm_dim < 1:
        raise ValueError(f"norm_dim={norm_dim!r}: must be a positive int")
    return norm_dim


@torch.no_grad()
def embed_width(
    model: CanonicalTransformer,
    width: int,
    heads: PerLayer = None,
    mlp: PerLayer = None,
    generator: torch.Generator | None = None,
    residual_map: Tensor | None = None,
    *,
    qheads: PerLayer = None,
    qk_dim: PerLayer = None,
    vo_dim: PerLayer = None,
    expert_units: PerLayer = None,
    norm_dim: int | None = None,
    stream_scale: float = 1.0,
    rotary_dims: int | None = None,
    rotary_freq_dim: int | None = None,
) -> CanonicalTransformer:
    """A model of residual width `width` computing exactly what `model` computes.

    heads, qheads, qk_dim, vo_dim, mlp, expert_units: per-layer sizes (an int, a list per layer, None to keep), each at
    least the model's. residual_map: (width, model.width) with orthonormal columns (default Haar-random).
    norm_dim: the result's RMS reference width (default `width`). stream_scale: the factor on every
    writer. rotary_dims, rotary_freq_dim: the result's rotary layout. Runs in float64, cast back."""
    config, m = model.config, model.width
    norm_dim = _checked_stream(model, width, residual_map, stream_scale, norm_dim)
    target = _targets(model, heads, qheads, mlp, qk_dim, vo_dim, expert_units)
    rotary = {}
    if config.rope_theta is not None and "qk_dim" in target:
        sizes = layer_sizes(model)["qk_dim"]
        wide = _rotary_target(config, sizes, target["qk_dim"], rotary_dims, rotary_freq_dim)
        index = rotary_index(RotaryHead.of(config, sizes[0]), wide, config.rope_scaling)
        rotary = {"index": index, "fields": wide.config_fields()}
    elif rotary_dims is not None or rotary_freq_dim is not None:
        raise ValueError("rotary_dims / rotary_freq_dim: the model has no rotary query/key heads")
    u = _residual_map(residual_map, width, m, generator)

    original = model.params()
    p = {k: v.detach().double() for k, v in original.items()}
    spec = SymmetrySpec.from_params(config, p, identity_spaces=True)  # one query head per group grows too
    if rotatable_stream(model):  # a stream that admits permutations only (post-norm, sandwich norms) stays
        p = apply_params(Transform({"residual": Orthogonal(u)}), spec, p)
        _scale_readers(p, spec, math.sqrt(config.norm_dim / norm_dim))
    if stream_scale != 1.0:
        for axis in spec["residual"].acts_on:
            if axis.side == "out":
                p[axis.param] = p[axis.param] * stream_scale

    # padding goes at the end of every head, head-dimension and unit axis; rotary dims go to their pairs
    for space in spec:
        if space.kind in ("residual", HEAD_HIDDEN):  # the stream is mapped above; a task head's hidden state stays
            continue
        size = target[SIZE_NAMES[space.kind]][space.layer]
        for axis in space.acts_on:
            if space.kind == "qk" and rotary:
                p[axis.param] = _placement(p[axis.param], axis.axis, rotary["index"], size)
            else:
                p[axis.param] = _pad(p[axis.param], axis.axis, size)

    out = {k: v.to(original[k].dtype) for k, v in p.items()}
    factor = stream_scale**2 * config.norm_dim / norm_dim
    eps = config.norm_eps if math.isclose(factor, 1.0, rel_tol=1e-12) else config.norm_eps * factor
    new_config = dataclasses.replace(config, norm_dim=norm_dim, norm_eps=eps, **rotary.get("fields", {}))
    return CanonicalTransformer(new_config, out)


STREAM_CHOICES = tuple(s.value for s in EmbedStream)  # the config's embed_stream values
# what the embedded model takes from the narrow one and must share with the wide one
_SAME_CONFIG = tuple(
    "family form activation causal pooling patch_size num_channels rope_theta rope_scaling sliding_window"
    " sliding_layers parallel_residual".split()
)


@torch.no_grad()
def match_widths(
    wide: CanonicalTransformer,
    narrow: CanonicalTransformer,
    generator: torch.Generator | None = None,
    stream: str = "keep",
) -> CanonicalTransformer:
    """`narrow` embedded to exactly the parameter shapes and norm_dim of `wide`, for any equal-shape matcher.

    stream="keep": the stream keeps its size and norm_eps becomes narrow's times n / N (a path interpolates
    it, glmc.interpolation.merge_configs); "rms": writers scaled by sqrt(N / n), norm_eps narrow's own."""
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
            raise ValueError(
                f"{name}: narrow has sizes {b}, wide {a} along axes no embedding pads (vocabulary, positions, "
                "classes, or the dims of heads normed over them)"
            )
    if narrow.width > wide.width:
        raise ValueError(f"width: narrow {narrow.width} is larger than wide {wide.width}")
    sizes_w, sizes_n = layer_sizes(wide), layer_sizes(narrow)
    if sizes_w.get("experts") != sizes_n.get("experts"):
        raise ValueError(
            f"experts: narrow has {sizes_n.get('experts')} per layer, wide {sizes_w.get('experts')}: an added "
            "expert would share the router's weights, so mixtures embed into mixtures of as many experts only"
        )
    for key, values in sizes_w.items():
        for l, (a, b) in enumerate(zip(values, sizes_n[key])):
            if b > a:
                raise ValueError(f"{key}: narrow has {b} in layer {l}, larger than wide's {a}")
    extra = {k: sizes_w[k] for k in ("qheads", "qk_dim", "vo_dim", "expert_units") if k in sizes_w}
    if wide.config.rope_theta is not None and "qk_dim" in sizes_w:  # the wide heads' rotary layout
        layout = RotaryHead.of(wide.config, sizes_w["qk_dim"][0])
        extra.update(rotary_dims=layout.rotating, rotary_freq_dim=layout.freq_dim)
    out = embed_width(
        narrow,
        wide.width,
        heads=sizes_w["heads"],
        mlp=sizes_w.get("mlp"),  # a mixture without a shared expert has experts only
        generator=generator,
        norm_dim=wide.config.norm_dim,
        stream_scale=math.sqrt(wide.config.norm_dim / narrow.config.norm_dim) if stream == "rms" else 1.0,
        **extra,
    )
    po = out.params()
    if list(po) != list(pw) or any(po[k].shape != pw[k].shape for k in pw):
        raise RuntimeError("match_widths: parameter shapes differ after embedding")
    return out


def _planned_heads(model: Any, keys: tuple[str, ...]) -> tuple[int, int, RotaryHead | None]:
    """(key/value heads, query heads per key/value head, the rotary layout or None) of the model a
    ModelConfig `model` builds, for a family that reads the model keys `keys`."""
    heads = int(model.num_heads)
    kv = int(model.num_kv_heads or heads) if "num_kv_heads" in keys else heads
    if "rope_theta" not in keys:
        return kv, heads // max(kv, 1), None
    size = int(model.hidden_size) // max(heads, 1)
    count = int(size * float(model.rotary_pct)) if "rotary_pct" in keys else size  # Hugging Face's int()
    return kv, heads // max(kv, 1), RotaryHead(size, rotating_dims(count), count)


def planned_width_problems(family: str, wide: Any, narrow: Any) -> list[str]:
    """Why an endpoint built from the ModelConfig `narrow` cannot be embedded exactly into one built from
    `wide` (match_widths), found before training; each problem names the keys that decide it."""
    keys = family_named(family).model_keys
    (kv_w, group_w, rotary_w), (kv_n, group_n, rotary_n) = (_planned_heads(m, keys) for m in (wide, narrow))
    problems = []
    if kv_n > kv_w:
        problems.append(f"{kv_n} key/value heads (model.num_kv_heads), more than the wide model's {kv_w}")
    if group_n > group_w:
        problems.append(
            f"{group_n} query heads per key/value head (model.num_heads / model.num_kv_heads), more than the "
            f"wide model's {group_w}"
        )
    if rotary_w is not None and rotary_n is not None:
        try:
            rotary_index(rotary_n, rotary_w, None)
        except ValueError as err:
            which = "model.hidden_size / model.num_heads" + (", model.rotary_pct" if "rotary_pct" in keys else "")
            problems.append(f"{err} (the head size and its rotary dims: {which})")
    return problems


def same_shapes(a: CanonicalTransformer, b: CanonicalTransformer) -> bool:
    """Whether two canonical models have the same parameters with the same shapes."""
    pa, pb = a.params(), b.params()
    return pa.keys() == pb.keys() and all(pa[k].shape == pb[k].shape for k in pa)
