"""The audit of a model's symmetry group: which maps keep its function is a numeric fact about the model.

For a canonical model (factored form): the group glmc uses in each space (SymmetrySpec: its family and block
kinds' declarations), a random element of every declared class applied and the logits compared (a class
that changes them is a bug), and a list of candidate classes, each applied at random and marked

  symmetry used       it keeps the function and a declared class contains it
  symmetry not used   it keeps the function and nothing declared contains it: a hole in the group
  not a symmetry      it changes the function

A candidate acts on tensors chosen apart from the declarations: the stream's readers and writers, the heads,
each head's query/key and value/output dims (the attention kinds' full roles), the MLP units, each unit's
whole scale and its up/down scale, the experts and each expert's units and scales (by canonical names).
It is used where a declared space acts on all of its axes with a class that contains the candidate's.
Everything runs in float64, so a map that keeps the function does so to ~1e-12 and one that does not
changes the logits by far more than TOLERANCE.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from glmc.models.blocks import grouped
from glmc.models.canonical import CanonicalTransformer, canonical_forward, num_layers, relative_deviation
from glmc.models.families import family_named
from glmc.models.families.roles import HEAD_PAIRS
from glmc.symmetry.apply import apply_params
from glmc.symmetry.groups import (
    Diagonal,
    Element,
    Orthogonal,
    OrthogonalScale,
    Permutation,
    PositiveDiagonal,
    SignedPermutation,
    random_orthogonal,
)
from glmc.symmetry.spec import Axis, Space, SymmetrySpec
from glmc.symmetry.transform import Transform

# the largest relative logit change (float64) of a map that keeps the function
TOLERANCE = 1e-8
USED, NOT_USED, NOT_SYMMETRY = "symmetry used", "symmetry not used", "not a symmetry"

# the declared classes that contain each candidate class (a per-head orthogonal is an orthogonal_scale)
CONTAINED_IN = {
    "permutation": {"permutation", "signed_permutation", "orthogonal", "semi_permutation", "invertible"},
    "sign_flips": {"signed_permutation", "orthogonal", "invertible", "diagonal"},
    "signed_permutation": {"signed_permutation", "orthogonal", "invertible"},
    "orthogonal": {"orthogonal", "orthogonal_scale", "invertible"},
    "positive_diagonal": {"positive_diagonal", "diagonal", "invertible"},
    "diagonal": {"diagonal", "invertible"},
}


@dataclass(frozen=True)
class Candidate:
    """A class tested on a model: `label` says what it is, `space` the space kind it acts in, `cls` the
    class sampled (a key of CONTAINED_IN)."""

    label: str
    space: str
    cls: str


CANDIDATES = (
    Candidate("stream permutations", "residual", "permutation"),
    Candidate("stream sign flips", "residual", "sign_flips"),
    Candidate("stream signed permutations", "residual", "signed_permutation"),
    Candidate("stream rotations", "residual", "orthogonal"),
    Candidate("stream diagonal scales", "residual", "positive_diagonal"),
    Candidate("head order", "heads", "permutation"),
    Candidate("per-head query/key rotations", "qk", "orthogonal"),
    Candidate("per-head value/output rotations", "vo", "orthogonal"),
    Candidate("MLP unit order", "mlp", "permutation"),
    Candidate("MLP unit scales", "unit_scale", "positive_diagonal"),
    Candidate("MLP unit sign flips", "unit_scale", "sign_flips"),
    Candidate("MLP up/down scales", "up_scale", "diagonal"),
    Candidate("expert order", "experts", "permutation"),
    Candidate("expert unit order", "expert_units", "permutation"),
    Candidate("expert unit scales", "expert_unit_scale", "positive_diagonal"),
    Candidate("expert up/down scales", "expert_up_scale", "diagonal"),
)

# unit scales by canonical tensor names: (name, axis, side, head axis); a unit's whole scale acts on every
# tensor writing it, its up/down scale on the linear (up) branch only
_UNIT_AXES = {
    "unit_scale": (("in_w", 0, "out", None), ("in_b", 0, "out", None), ("gate_w", 0, "out", None)),
    "up_scale": (("in_w", 0, "out", None), ("in_b", 0, "out", None)),
    "expert_unit_scale": (("expert_gate_w", 1, "out", 0), ("expert_in_w", 1, "out", 0)),
    "expert_up_scale": (("expert_in_w", 1, "out", 0),),
}
_UNIT_READERS = {"unit_scale": ("out_w", 1), "up_scale": ("out_w", 1)}
_UNIT_READERS |= {"expert_unit_scale": ("expert_out_w", 2), "expert_up_scale": ("expert_out_w", 2)}


@dataclass
class Finding:
    """One class applied to the model: `what` names it, `deviation` is the relative logit change."""

    what: str
    space: str
    cls: str
    deviation: float
    status: str


@dataclass
class Audit:
    family: str
    blocks: dict[str, str]
    group: dict[str, tuple[str, ...]]  # space kind -> the classes glmc uses there
    generators: list[Finding] = field(default_factory=list)
    candidates: list[Finding] = field(default_factory=list)

    @property
    def holes(self) -> list[Finding]:
        return [f for f in self.candidates if f.status == NOT_USED]

    @property
    def bugs(self) -> list[Finding]:
        """Declared classes that change the function."""
        return [f for f in self.generators if f.status == NOT_SYMMETRY]

    @property
    def ok(self) -> bool:
        return not self.holes and not self.bugs

    def group_line(self) -> str:
        """The group in one line, as docs/architectures.md lists it: "space: classes; ..."."""
        return "; ".join(f"{space}: {', '.join(classes)}" for space, classes in self.group.items())

    def __str__(self) -> str:
        blocks = ", ".join(f"{k} {v}" for k, v in self.blocks.items())
        lines = [f"symmetry audit of a {self.family} model ({blocks})", "", "group used (space: classes):"]
        lines += [f"  {space:<18} {', '.join(classes)}" for space, classes in self.group.items()]
        lines += ["", "declared classes (a random element applied, relative change of the logits):"]
        lines += [f"  {f.what:<40} {f.deviation:9.1e}  {f.status}" for f in self.generators]
        lines += ["", "candidate classes:"]
        lines += [f"  {f.what:<40} {f.deviation:9.1e}  {f.status}" for f in self.candidates]
        problems = [f"hole: {f.what} ({f.space}, {f.cls}) keeps the function but is not used" for f in self.holes]
        problems += [f"bug: {f.what} is declared but changes the function" for f in self.bugs]
        return "\n".join(lines + [""] + (problems or ["no hole: every candidate that keeps the function is used"]))


def example_inputs(model: CanonicalTransformer, batch: int = 2, seq: int = 9, seed: int = 0) -> Tensor:
    """Random inputs the model reads: images of its size, or token ids of its vocabulary."""
    g, p, config = torch.Generator().manual_seed(seed), model.params(), model.config
    if config.patch_size is not None:
        side = round((p["embed.pos"].shape[0] - 1) ** 0.5) * config.patch_size
        return torch.randn(batch, config.num_channels, side, side, generator=g, dtype=torch.float64)
    return torch.randint(0, p["embed.tokens"].shape[0], (batch, seq), generator=g)


def _sample(cls: str, space: Space, g: torch.Generator) -> Element:
    n, heads = space.size, space.heads
    if cls == "permutation":
        return Permutation.sample(n, g, heads)
    if cls == "sign_flips":
        return SignedPermutation.sample(n, g, torch.float64) if heads is None else Diagonal(_signs((heads, n), g))
    if cls == "signed_permutation":
        return SignedPermutation.sample(n, g, torch.float64)
    if cls == "orthogonal" and heads is None:
        return Orthogonal.sample(n, g, dtype=torch.float64)
    if cls == "orthogonal":
        rotations = random_orthogonal(n, n, g, (heads,), torch.float64)
        return OrthogonalScale(rotations, torch.ones(heads, dtype=torch.float64))
    return (PositiveDiagonal if cls == "positive_diagonal" else Diagonal).sample(n, g, torch.float64, heads)


def _signs(shape: tuple[int, ...], g: torch.Generator) -> Tensor:
    return torch.where(torch.rand(shape, generator=g) < 0.5, -1.0, 1.0).double()


def _flips_only(element: Element) -> Element:
    """A sign-flip candidate of a single space: its signs with the identity order."""
    if isinstance(element, SignedPermutation):
        return SignedPermutation(torch.arange(element.size), element.signs)
    return element


class _Probe:
    """The model in float64 and its logits on fixed inputs: deviation(new params) compares new logits."""

    def __init__(self, model: CanonicalTransformer):
        self.config = model.config
        self.params = {k: v.detach().double() for k, v in model.params().items()}
        self.inputs = example_inputs(model)
        with torch.no_grad():
            self.logits = canonical_forward(self.config, self.params, self.inputs)

    def deviation(self, transform: Transform, spec: SymmetrySpec, strict: bool) -> float:
        with torch.no_grad():
            new = apply_params(transform, spec, self.params, strict)
            return relative_deviation(canonical_forward(self.config, new, self.inputs), self.logits)


def _candidate_spaces(candidate: Candidate, spec: SymmetrySpec, params: dict[str, Tensor]) -> list[Space]:
    """The spaces a candidate acts in on this model (none where the model has no such tensors)."""
    if candidate.space in _UNIT_AXES:
        return list(_unit_spaces(candidate.space, params))
    declared = [s for s in spec if s.kind == candidate.space]
    if candidate.space in HEAD_PAIRS and not declared:  # a kind without the pair: the full roles' axes
        return list(_pair_spaces(candidate.space, params))
    return declared


def _unit_spaces(kind: str, params: dict[str, Tensor]) -> Iterator[Space]:
    for layer in range(num_layers(params)):
        pre = f"blocks.{layer}."
        reader, axis = _UNIT_READERS[kind]
        if pre + reader not in params or (kind == "up_scale" and pre + "gate_w" not in params):
            continue
        writers = [(n, a, s, h) for n, a, s, h in _UNIT_AXES[kind] if pre + n in params]
        head = None if writers[0][3] is None else 0
        axes = tuple(Axis(pre + n, a, s, h) for n, a, s, h in writers) + (Axis(pre + reader, axis, "in", head),)
        heads = None if head is None else params[pre + reader].shape[0]
        yield Space(f"{kind}.{layer}", kind, layer, params[pre + reader].shape[axis], (), axes, heads=heads)


def _pair_spaces(kind: str, params: dict[str, Tensor]) -> Iterator[Space]:
    """A per-head pair's spaces from grouped attention's roles (the widest layout), where the tensors fit."""
    for layer in range(num_layers(params)):
        axes = []
        for role in grouped.ROLES:
            name = role.at(layer)
            for acts in role.acts_on(kind):
                if name in params and params[name].dim() > acts.axis:
                    axes.append(Axis(name, acts.axis, acts.side, acts.head_axis))
        if axes:
            first = params[axes[0].param]
            heads = first.shape[axes[0].head_axis]
            yield Space(f"{kind}.{layer}", kind, layer, first.shape[axes[0].axis], (), tuple(axes), heads=heads)


def _used(candidate: Candidate, spaces: list[Space], spec: SymmetrySpec) -> bool:
    """Whether declared spaces cover each candidate space: one acting on all its axes with a class that
    contains the candidate's."""
    classes = CONTAINED_IN[candidate.cls]

    def covered(space: Space) -> bool:
        wanted = {(ax.param, ax.axis) for ax in space.acts_on}
        return any(set(s.classes) & classes and wanted <= {(ax.param, ax.axis) for ax in s.acts_on} for s in spec)

    return all(covered(s) for s in spaces)


def audit(model: CanonicalTransformer, seed: int = 0) -> Audit:
    """The audit of `model`'s symmetry group (module docstring)."""
    if model.config.form != "factored":
        raise ValueError("the audit reads a model in factored form: audit the model before to_circuit()")
    family = family_named(model.config.family)
    spec = SymmetrySpec.from_model(model)
    probe, g = _Probe(model), torch.Generator().manual_seed(seed)
    attention, mlp = family.block_kinds("factored")
    blocks = {"attention": attention.name, "mlp": mlp.name}
    if family.branch_block() is not None:
        blocks["branch"] = family.branch_block().name
    group: dict[str, tuple[str, ...]] = {}
    for space in spec:
        group.setdefault(space.kind, space.classes)
    result = Audit(family.name, blocks, group)
    for kind, classes in group.items():
        for cls in classes:
            grow = 2 if cls == "semi_permutation" else 0  # copies of units, not only their order
            transform = Transform.sample(spec, {kind: cls}, g, grow=grow, dtype=torch.float64)
            deviation = probe.deviation(transform, spec, strict=True)
            status = USED if deviation <= TOLERANCE else NOT_SYMMETRY
            result.generators.append(Finding(f"{kind}: {cls}", kind, cls, deviation, status))
    for candidate in CANDIDATES:
        spaces = _candidate_spaces(candidate, spec, probe.params)
        if not spaces:
            continue
        elements = {s.name: _sample(candidate.cls, s, g) for s in spaces}
        if candidate.cls == "sign_flips":
            elements = {k: _flips_only(e) for k, e in elements.items()}
        own = SymmetrySpec({s.name: replace(s, classes=()) for s in spaces})
        deviation = probe.deviation(Transform(elements), own, strict=False)
        if deviation > TOLERANCE:
            status = NOT_SYMMETRY
        else:
            status = USED if _used(candidate, spaces, spec) else NOT_USED
        result.candidates.append(Finding(candidate.label, candidate.space, candidate.cls, deviation, status))
    return result
