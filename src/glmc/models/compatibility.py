"""Whether two canonical models can be aligned and interpolated: the same architecture, tensor by tensor.

`check_compatible(a, b)` raises ValueError naming the first difference, e.g. "model_b has 3 layers,
model_a has 2", before a matcher fails on a shape deep inside its solver.
"""

from __future__ import annotations

from collections.abc import Iterator

from glmc.models.canonical import CanonicalTransformer


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
    yield "has {} positions", pb["embed.pos"].shape[0], pa["embed.pos"].shape[0]
    if ca.family == "gpt2":
        yield "has a vocabulary of {} tokens", pb["embed.tokens"].shape[0], pa["embed.tokens"].shape[0]
    else:
        yield "has patch size {}", cb.patch_size, ca.patch_size
        yield "has {} input channels", cb.num_channels, ca.num_channels
    yield "has {} classes", pb["head.w"].shape[0], pa["head.w"].shape[0]
    for l in range(a.num_layers):
        pre = f"blocks.{l}."
        if ca.form == "factored":
            yield f"has {{}} heads in layer {l}", pb[pre + "q_w"].shape[0], pa[pre + "q_w"].shape[0]
            yield f"has query/key head dim {{}} in layer {l}", pb[pre + "q_w"].shape[1], pa[pre + "q_w"].shape[1]
            yield f"has value head dim {{}} in layer {l}", pb[pre + "v_w"].shape[1], pa[pre + "v_w"].shape[1]
        else:
            yield f"has {{}} heads in layer {l}", pb[pre + "qk"].shape[0], pa[pre + "qk"].shape[0]
        if equal_mlp:
            yield f"has MLP width {{}} in layer {l}", pb[pre + "in_w"].shape[0], pa[pre + "in_w"].shape[0]


def check_compatible(a: CanonicalTransformer, b: CanonicalTransformer, equal_mlp: bool = True) -> None:
    """ValueError naming the first property in which `b` differs from `a`. `equal_mlp=False` allows
    MLP widths to differ (for matchers that widen the MLP)."""
    for what, vb, va in _differences(a, b, equal_mlp):
        if vb != va:
            raise ValueError(
                f"model_a and model_b do not fit together: model_b {what.format(vb)}, model_a {what.format(va)}"
            )
