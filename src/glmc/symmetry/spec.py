"""SymmetrySpec: the named spaces of a canonical model that carry a group, and where each acts.

Derived from the model's tensors, never listed by hand:
  residual   the stream (size D)                   orthogonal (incl. rectangular m >= n), permutation
  heads.{l}  the heads of layer l (size H)         permutation, semi_permutation
  qk.{l}     per head, the query/key space (dh)    invertible, orthogonal_scale   (factored form only)
  vo.{l}     per head, the value space (dv)        invertible, orthogonal_scale   (factored form only)
  mlp.{l}    the MLP neurons of layer l (size F)   permutation; semi_permutation for ReLU-like activations
In circuit form the qk and vo symmetries are absorbed by the representation (QK and OV are
invariant under them), so those spaces are not listed; `absorbed` names them.

Each space lists the (parameter, axis, side) triples it acts on, like git-re-basin's
PermutationSpec: side "out" where the parameter writes into the space (it gets g), "in" where it
reads from it (it gets g's inverse transpose). Spaces are ordered so that applying them in order is
well defined: heads.{l} comes before qk.{l} and vo.{l}, which are indexed by the new heads.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from glmc.models.canonical import RELU_FAMILY, CanonicalConfig, CanonicalTransformer, num_layers


@dataclass(frozen=True)
class Axis:
    param: str
    axis: int
    side: str  # "out" | "in"
    head_axis: int | None = None  # per-head spaces: the axis that indexes heads
    extra: int = 0  # trailing entries the group leaves alone (the constant-1 coordinate of circuits)


@dataclass(frozen=True)
class Space:
    name: str
    kind: str  # residual | heads | qk | vo | mlp
    layer: int | None
    size: int  # number of units; for per-head spaces the head dimension
    classes: tuple[str, ...]
    acts_on: tuple[Axis, ...]
    heads: int | None = None  # per-head spaces: number of heads (one group element each)
    shares_on: str = "in"  # semi-permutations: the side whose copies are scaled by the shares


@dataclass
class SymmetrySpec:
    spaces: dict[str, Space]
    absorbed: tuple[str, ...] = ()

    @classmethod
    def from_model(cls, model: CanonicalTransformer) -> SymmetrySpec:
        return cls.from_params(model.config, dict(model.named_parameters()))

    @classmethod
    def from_params(cls, config: CanonicalConfig, params: dict) -> SymmetrySpec:
        circuit = config.form == "circuit"
        layers = range(num_layers(params))
        spaces = [_residual(config, params, layers)]
        for l in layers:
            spaces += [_heads(params, l, circuit)]
            if not circuit:
                spaces += [_qk(params, l), _vo(params, l)]
            spaces += [_mlp(config, params, l)]
        absorbed = tuple(f"{k}.{l}" for l in layers for k in ("qk", "vo")) if circuit else ()
        return cls({s.name: s for s in spaces}, absorbed)

    def __getitem__(self, name: str) -> Space:
        return self.spaces[name]

    def __iter__(self):
        return iter(self.spaces.values())

    def names(self, kind: str | None = None) -> list[str]:
        return [s.name for s in self if kind is None or s.kind == kind]

    def classes_for(self, name: str) -> tuple[str, ...]:
        return self.spaces[name].classes

    def restricted_to(self, params: set[str]) -> SymmetrySpec:
        """The same spaces acting only on the named parameters (e.g. to skip a huge embedding)."""
        spaces = {}
        for name, space in self.spaces.items():
            axes = tuple(ax for ax in space.acts_on if ax.param in params)
            if axes:
                spaces[name] = replace(space, acts_on=axes)
        return SymmetrySpec(spaces, self.absorbed)


def _residual(config, params, layers) -> Space:
    writers = ["embed.pos"] + (["embed.tokens"] if config.family == "gpt2" else [])
    axes = [Axis(p, 1, "out") for p in writers]
    if config.family == "vit":
        axes += [Axis("embed.patch_w", 0, "out"), Axis("embed.patch_b", 0, "out"), Axis("embed.cls", 0, "out")]
    for l in layers:
        b = f"blocks.{l}."
        if config.form == "circuit":
            axes += [Axis(b + "qk", 1, "in", extra=1), Axis(b + "qk", 2, "in", extra=1)]
            axes += [Axis(b + "ov", 1, "out"), Axis(b + "ov", 2, "in", extra=1)]
        else:
            axes += [Axis(b + n, 2, "in") for n in ("q_w", "k_w", "v_w")] + [Axis(b + "o_w", 1, "out")]
        axes += [Axis(b + "o_b", 0, "out"), Axis(b + "in_w", 1, "in")]
        axes += [Axis(b + "out_w", 0, "out"), Axis(b + "out_b", 0, "out")]
    axes += [Axis("head.w", 1, "in")]
    size = params["head.w"].shape[1]
    return Space("residual", "residual", None, size, ("orthogonal", "permutation"), tuple(axes))


def _heads(params, l, circuit) -> Space:
    b = f"blocks.{l}."
    writers = ["qk"] if circuit else ["q_w", "q_b", "k_w", "k_b", "v_w", "v_b"]
    axes = [Axis(b + n, 0, "out") for n in writers] + [Axis(b + ("ov" if circuit else "o_w"), 0, "in")]
    size = params[b + ("qk" if circuit else "q_w")].shape[0]
    # a head's output is linear in its output weights: copies split o_w (or ov) by their shares
    return Space(f"heads.{l}", "heads", l, size, ("permutation", "semi_permutation"), tuple(axes), shares_on="in")


def _qk(params, l) -> Space:
    # scores q^T k are unchanged by q -> A q, k -> A^-T k (weights and biases alike)
    b = f"blocks.{l}."
    axes = [Axis(b + n, 1, "out", head_axis=0) for n in ("q_w", "q_b")]
    axes += [Axis(b + n, 1, "in", head_axis=0) for n in ("k_w", "k_b")]
    heads, size = params[b + "q_w"].shape[:2]
    return Space(f"qk.{l}", "qk", l, size, ("invertible", "orthogonal_scale"), tuple(axes), heads=heads)


def _vo(params, l) -> Space:
    # o_w v is unchanged by v -> B v, o_w -> o_w B^-1
    b = f"blocks.{l}."
    axes = [Axis(b + n, 1, "out", head_axis=0) for n in ("v_w", "v_b")] + [Axis(b + "o_w", 2, "in", head_axis=0)]
    heads, size = params[b + "v_w"].shape[:2]
    return Space(f"vo.{l}", "vo", l, size, ("invertible", "orthogonal_scale"), tuple(axes), heads=heads)


def _mlp(config, params, l) -> Space:
    b = f"blocks.{l}."
    axes = (Axis(b + "in_w", 0, "out"), Axis(b + "in_b", 0, "out"), Axis(b + "out_w", 1, "in"))
    classes = ("permutation", "semi_permutation") if config.activation in RELU_FAMILY else ("permutation",)
    # positive homogeneity: act(w z) = w act(z), so copies scale their input weights by the shares
    return Space(f"mlp.{l}", "mlp", l, params[b + "in_w"].shape[0], classes, axes, shares_on="out")
