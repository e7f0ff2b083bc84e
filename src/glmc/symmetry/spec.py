"""SymmetrySpec: the named spaces of a canonical model that carry a group, and where each acts.

Derived from the roles its family gives each tensor (glmc.models.families), never listed by hand:
  residual      the stream (D)                  orthogonal (incl. rectangular), permutation (post-norm: only this)
  heads.{l}     heads, or key/value groups (H)  permutation, semi_permutation
  qheads.{l}    per group, its query heads (G)  permutation (grouped-query only; not built for G = 1)
  qk.{l}, vo.{l} per head, query/key and value  invertible, orthogonal_scale (factored form only; rotary qk:
                spaces                          rotary_scale, with an invertible block on unrotated dims)
  mlp.{l}       MLP units (F)                   permutation; semi_permutation for plain ReLU-like MLPs
  mlp_scale.{l} a gated MLP's linear branch     diagonal; a plain ReLU-like MLP's units: positive_diagonal (not
                built for other activations)
  experts.{l}   a mixture's experts (E)         permutation (router rows with their experts)
  expert_units.{l} per expert, its units (F)    permutation, one per expert
  expert_scale.{l} per expert, its up branch    diagonal, one per expert (after expert_units)
  head_hidden   a task head's own hidden state  permutation
In circuit form qk and vo are absorbed by the representation (`absorbed` names them). Each space lists
the (parameter, axis, side) triples it acts on: "out" where the parameter writes into it (it gets g),
"in" where it reads (g's inverse transpose). heads.{l} precedes qk.{l} and vo.{l}, indexed by new heads.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace

from glmc.models.canonical import RELU_FAMILY, CanonicalConfig, CanonicalTransformer, num_layers
from glmc.models.families import family_named
from glmc.models.families.roles import HEAD_HIDDEN, HEAD_PAIRS, layer_space_order


@dataclass(frozen=True)
class Axis:
    param: str
    axis: int
    side: str  # "out" | "in"
    head_axis: int | None = None  # per-head spaces: the axis that indexes heads
    extra: int = 0  # trailing entries the group leaves alone (the constant-1 coordinate of circuits)
    gain: bool = False  # an elementwise gain: a signed permutation moves it without flipping its signs


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
    rotary_dims: int | None = None  # rotary qk spaces: the leading dims that rotate (partial rotary: < size)


@dataclass
class SymmetrySpec:
    spaces: dict[str, Space]
    absorbed: tuple[str, ...] = ()

    @classmethod
    def from_model(cls, model: CanonicalTransformer) -> SymmetrySpec:
        return cls.from_params(model.config, dict(model.named_parameters()))

    @classmethod
    def from_params(cls, config: CanonicalConfig, params: dict, identity_spaces: bool = False) -> SymmetrySpec:
        """Every space that the family's roles place on these tensors, in the order: residual, then per
        layer heads, qk, vo, mlp (the axes of a space in the order of the roles). identity_spaces: also the
        spaces whose group is the identity (one query head per group), for code that pads their axes."""
        family = family_named(config.family)
        layers = range(num_layers(params))
        axes: dict[str, list[Axis]] = defaultdict(list)
        kinds: dict[str, tuple[str, int | None]] = {"residual": ("residual", None)}
        roles = [(r, None) for r in family.embed_roles]
        roles += [(r, l) for l in layers for r in family.blocks(config.form)]
        roles += [(r, None) for r in family.heads(config)]
        for role, layer in roles:
            for acts in role.acts:
                # the stream and the head's hidden state are one space for the whole model, others per layer
                name = acts.space if acts.space in ("residual", HEAD_HIDDEN) else f"{acts.space}.{layer}"
                kinds[name] = (acts.space, layer if name != acts.space else None)
                axes[name].append(Axis(role.at(layer), acts.axis, acts.side, acts.head_axis, acts.extra, acts.gain))
        per_layer = layer_space_order(kind for kind, _ in kinds.values())
        order = ["residual"] + [f"{k}.{l}" for l in layers for k in per_layer] + [HEAD_HIDDEN]
        spaces = [_space(config, family, n, *kinds[n], tuple(axes[n]), params) for n in order if n in axes]
        # a space with no class (a plain MLP's unit scales where the activation is not ReLU-like) is not built
        spaces = [s for s in spaces if s.classes and (identity_spaces or not _identity_only(s))]
        absorbed = tuple(f"{k}.{l}" for l in layers for k in HEAD_PAIRS) if config.form == "circuit" else ()
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


def _identity_only(space: Space) -> bool:
    """One query head per key/value group: its permutations are the identity, so the space is not built
    (no sampled element, matcher output or test case for a group that moves nothing)."""
    return space.kind == "qheads" and space.size == 1


def _space(config, family, name, kind, layer, axes, params) -> Space:
    first = axes[0]
    size = params[first.param].shape[first.axis] - first.extra
    if kind == "residual":  # the family's classes that each of its block kinds admits
        kinds = family.kinds(config.form)
        classes = tuple(c for c in family.residual_classes if all(c in k.residual_classes for k in kinds))
        return Space(name, kind, None, size, classes, axes)
    if kind == HEAD_HIDDEN:  # a LayerNorm or tanh follows: neither homogeneous nor rotation-invariant
        return Space(name, kind, None, size, ("permutation",), axes)
    if kind == "heads":
        # a head's output is linear in its output weights: copies split o_w (or ov) by their shares, where
        # the attention kind keeps them (its head_classes)
        classes = family.block_kinds(config.form)[0].head_classes
        return Space(name, kind, layer, size, classes, axes, shares_on="in")
    heads = None if first.head_axis is None else params[first.param].shape[first.head_axis]
    if kind == "qheads":
        return Space(name, kind, layer, size, ("permutation",), axes, heads=heads)
    if kind == "qk" and config.rope_theta is not None:
        # only maps commuting with every position's rotation; any invertible map of the unrotated dims
        rotary = size if config.rotary_dims is None else config.rotary_dims
        return Space(name, kind, layer, size, ("rotary_scale",), axes, heads=heads, rotary_dims=rotary)
    if kind in HEAD_PAIRS:
        return Space(name, kind, layer, size, ("invertible", "orthogonal_scale"), axes, heads=heads)
    if kind == "mlp_scale":  # gated: sign and scale; plain: positive homogeneity, act(a z) = a act(z) for a > 0
        if f"blocks.{layer}.gate_w" in params:  # the gate branch, which the scale leaves alone, beside
            return Space(name, kind, layer, size, ("diagonal",), axes)
        classes = ("positive_diagonal",) if config.activation in RELU_FAMILY else ()
        return Space(name, kind, layer, size, classes, axes)
    if kind == "expert_scale":  # each expert's gated units against their up branch: one diagonal per expert
        return Space(name, kind, layer, size, ("diagonal",), axes, heads=heads)
    if heads is not None:  # units within each head or expert: one permutation per batch entry
        return Space(name, kind, layer, size, ("permutation",), axes, heads=heads)
    relu_like = kind == "mlp" and config.activation in RELU_FAMILY and family.mlp_kind == "plain"
    classes = ("permutation", "semi_permutation") if relu_like else ("permutation",)
    # positive homogeneity: act(w z) = w act(z), so copies scale their input weights by the shares
    return Space(name, kind, layer, size, classes, axes, shares_on="out")
