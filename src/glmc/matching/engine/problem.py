"""Weight matching's search (glmc.matching.weight): the problem computed once (MatchingProblem), where
the search stands (SearchState), what late iterations carry over (Reuse) and the objective."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch
from torch import Tensor

from glmc.matching.engine.assignment import PARALLEL_UNITS
from glmc.matching.engine.circuits import (
    a_circuit_terms,
    circuit_norms,
    circuit_square_norms,
    squared_difference,
    squared_norm,
    squared_plain_difference,
    squared_plain_norm,
)
from glmc.matching.engine.head_hidden import HiddenHead
from glmc.matching.engine.layerwise import LayerwiseParams
from glmc.matching.engine.mlp_distance import MlpDistance, mlp_matrices
from glmc.matching.engine.mlp_units import mlp_similarity
from glmc.matching.engine.residual_map import (
    Outside,
    linear_parts,
    outside_terms,
    residual_only_tensors,
    residual_vectors,
)
from glmc.matching.engine.warm_assignment import WarmAssignments
from glmc.models.canonical import CanonicalTransformer
from glmc.models.families import family_named
from glmc.models.families.roles import HEAD_HIDDEN, layer_of
from glmc.symmetry import Diagonal, Orthogonal, Permutation, SymmetrySpec, Transform, apply_params
from glmc.symmetry.groups import Element, SignedPermutation

Params = dict[str, Tensor]

# from this size of B's layer weights (or in a run of large folders: MatchContext.lean_memory) the search holds
# none of their transformed copies whole, runs its per-layer steps a layer at a time together, solves the MLP
# layers one at a time and hands freed pages back after each layer: it then needs about half a model beside
# the two (a Pythia-160M pair: 0.6 GiB, against 1.6 GiB holding B's copies and two layers' solves) and takes
# about 1.4 times as long (187-225 s against 148 s)
LAYERWISE_BYTES = 2**30


@dataclass
class MatchingProblem:
    """What the search compares, fixed for its whole run: A's and B's layer weights in the search's
    dtype, B's symmetry spaces, the family's kind of heads and what lies outside the layers."""

    pa: Params  # A's layer weights
    pb: Params  # B's layer weights
    spec: SymmetrySpec
    spec_blocks: SymmetrySpec  # restricted to the layer weights
    layers: range
    width: int
    dtype: torch.dtype
    device: torch.device  # where every product of the search runs (assignments: glmc.matching.engine.assignment)
    factored: bool  # no circuit form (grouped rotary heads): the factored distance itself is matched
    grouped: bool  # grouped-query attention: key/value groups, query heads within them
    rotary_dims: int | None  # partial rotary: the leading dims of each query/key head that rotate
    layout: dict
    vectors: tuple[str, ...]  # residual_vectors
    outside: Outside
    hidden: HiddenHead | None  # a task head's hidden state (BERT's masked-LM transform, pooler)
    # B's transformed weights computed layer by layer as read, never held whole (glmc.matching.engine.layerwise)
    layerwise: bool = False

    @classmethod
    def build(
        cls,
        model_a: CanonicalTransformer,
        model_b: CanonicalTransformer,
        dtype: torch.dtype,
        tokens: Tensor | None,
        layerwise: bool | None = None,
        device: str | torch.device | None = None,
        unit_scales: bool = True,
    ) -> MatchingProblem:
        """The problem in `dtype` on `device` (None: where A's weights are); tensors already there in that
        dtype are not copied. `unit_scales=False`: plain ReLU-like units compared without their scales."""
        spec = SymmetrySpec.from_model(model_b)
        if not unit_scales:  # the search without that space is the one before it was declared
            kept = {n: s for n, s in spec.spaces.items() if s.kind != "mlp_scale" or "diagonal" in s.classes}
            spec = SymmetrySpec(kept, spec.absorbed)
        params_a = model_a.params()
        device = torch.device(device) if device is not None else next(iter(params_a.values())).device
        pa = {k: v.detach().to(device=device, dtype=dtype) for k, v in params_a.items()}
        pb = {k: v.detach().to(device=device, dtype=dtype) for k, v in model_b.params().items()}
        if tokens is not None:
            tokens = tokens.to(device)
        hidden = HiddenHead(spec, pa, pb) if HEAD_HIDDEN in spec.spaces else None
        # embeddings and classifier see only the residual map: their share is computed once
        outside = outside_terms(pa, pb, residual_only_tensors(model_b), hidden, tokens)
        pa = {k: v for k, v in pa.items() if layer_of(k) is not None}
        pb = {k: v for k, v in pb.items() if layer_of(k) is not None}
        family = family_named(model_b.config.family)
        nbytes = sum(t.numel() * t.element_size() for t in pb.values())
        return cls(
            pa=pa,
            pb=pb,
            spec=spec,
            spec_blocks=spec.restricted_to(set(pb)),
            layers=range(model_a.num_layers),
            width=model_a.width,
            dtype=dtype,
            device=device,
            factored=not family.circuit_form,
            grouped=family.attention_block().grouped,
            rotary_dims=model_b.config.rotary_dims,
            layout=family.layout(model_b.config),
            vectors=residual_vectors(model_b),
            outside=outside,
            hidden=hidden,
            layerwise=layerwise if layerwise is not None else nbytes > LAYERWISE_BYTES,
        )

    def transformed(self, transform: Transform, spec: SymmetrySpec, source: Params) -> Params:
        """`source` (B's layer weights, or B's under another transform) under `transform`: whole, or
        layer by layer as read for large models."""
        if self.layerwise:
            return LayerwiseParams(source, transform, spec)
        return apply_params(transform, spec, source)

    @property
    def gated(self) -> bool:
        """Whether the MLPs are gated: their units carry an up/down scale of either sign."""
        return "diagonal" in self._unit_scale_classes()

    @property
    def scaled(self) -> bool:
        """Whether plain ReLU-like units carry a positive scale (in row and bias against out column)."""
        return "positive_diagonal" in self._unit_scale_classes()

    def _unit_scale_classes(self) -> tuple[str, ...]:
        space = self.spec.spaces.get(f"mlp_scale.{self.layers[0]}")
        return () if space is None else space.classes

    def residual_matrix(self, t: dict[str, Element]) -> Tensor:
        """The residual map of t as a dense matrix (the identity without one)."""
        g = t.get("residual")
        if g is None:
            return torch.eye(self.width, dtype=self.dtype, device=self.device)
        return g.dense(self.dtype) if isinstance(g, (Permutation, SignedPermutation)) else g.matrix.to(self.dtype)

    @property
    def gains(self) -> frozenset[str]:
        """B's layer tensors that are elementwise gains on the stream (a sandwich norm's): a signed residual
        permutation moves them without their signs."""
        if "residual" not in self.spec.spaces:
            return frozenset()
        return frozenset(ax.param for ax in self.spec["residual"].acts_on if ax.gain and ax.param in self.pb)


@dataclass
class SearchState:
    """Where the search stands: the group elements found so far, and B's layer weights under them."""

    res: dict[str, Element]  # the residual map ({} without one)
    perms: Transform  # head, MLP and in-head elements
    head: dict[str, Permutation]  # the head's hidden permutation, where that space exists
    pb_cur: Params | None  # B's layer weights under the last iteration's transform
    pb_res: Params | None = None  # within an iteration: under the new residual map only
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def transform(self) -> Transform:
        return Transform({**self.res, **self.perms, **self.head})


def start_state(problem: MatchingProblem, residual: str, heads: bool, mlp: bool) -> SearchState:
    """The identity of every space searched over."""
    spec, layers, device = problem.spec, problem.layers, problem.device
    perms = Transform()
    if heads:
        perms.update({f"heads.{l}": Permutation.identity(spec[f"heads.{l}"].size) for l in layers})
        if problem.grouped:
            query_heads = [spec[f"qheads.{l}"] for l in layers if f"qheads.{l}" in spec.spaces]
            perms.update({q.name: Permutation.identity(q.size, q.heads) for q in query_heads})
    if mlp and f"mlp.{layers[0]}" in spec.spaces:  # a mixture of experts has none (glmc.matching.engine.experts)
        perms.update({f"mlp.{l}": Permutation.identity(spec[f"mlp.{l}"].size) for l in layers})
        if problem.gated or problem.scaled:
            perms.update({f"mlp_scale.{l}": Diagonal.identity(spec[f"mlp_scale.{l}"].size) for l in layers})
    perms = perms.to(device=device)  # the solved elements live there too: compared with these
    res = {}
    if residual == "orthogonal":
        res = {"residual": Orthogonal(torch.eye(problem.width, dtype=problem.dtype, device=device))}
    elif residual == "permutation":
        res = {"residual": Permutation.identity(problem.width).to(device=device)}
    elif residual == "signed_permutation":
        res = {"residual": SignedPermutation.identity(problem.width).to(device=device, dtype=problem.dtype)}
    hidden = problem.hidden
    head = {} if hidden is None else {HEAD_HIDDEN: Permutation.identity(hidden.size).to(device=device)}
    # the identity leaves every weight exactly as it is: B's own weights
    return SearchState(res, perms, head, dict(problem.pb))


@dataclass
class Reuse:
    """What late iterations keep from one iteration to the next (weight_matching's `reuse`): certified
    head and MLP assignments, and on the `late` path (large circuit-form MLPs) rotated MLP matrices, the
    expanded MLP distance, each layer's linear share and the Gram polar factor (`gram_misses`). Smaller
    models keep the plain arithmetic (the same floats, so learned matching retraces its runs)."""

    problem: MatchingProblem
    mlp: WarmAssignments | None
    heads: WarmAssignments | None
    head_norms: list[float]  # per layer, B's largest circuit norm (circuit_move)
    late: bool
    spec_rest: SymmetrySpec  # what each iteration's maps are applied to (late: all but the MLP matrices)
    spec_mlp: dict[int, SymmetrySpec]  # late: per layer, its MLP matrices
    pa_rest: Params  # late: A's layer weights but the MLP matrices
    b_norms: dict[int, list[Tensor]] | None  # late: B's circuit norms (the maps leave them as they are)
    mlp_distance: MlpDistance
    linear_shares: dict[int, tuple[Tensor, dict[str, Tensor]]] = field(default_factory=dict)
    rotated: dict[int, Params] = field(default_factory=dict)
    gram_misses: int = 0

    @classmethod
    def build(cls, problem: MatchingProblem, residual: str, heads: bool, mlp: bool, reuse: bool) -> Reuse:
        spec, layers, pa, pb = problem.spec, problem.layers, problem.pa, problem.pb
        # MLP cosines move by at most the map's move, so their assignments carry over (not scaled units; below
        # PARALLEL_UNITS units the solver is as cheap)
        big = mlp and f"mlp.{layers[0]}" in spec.spaces and spec[f"mlp.{layers[0]}"].size >= PARALLEL_UNITS
        scaled = problem.gated or problem.scaled  # their costs are not one cosine: no certificates
        warm = WarmAssignments() if reuse and big and not scaled and residual != "none" else None
        # head costs move by at most circuit_move: theirs carry over too (not in grouped rotary models)
        head_warm = WarmAssignments() if reuse and heads and not problem.grouped and residual != "none" else None
        head_norms = [float(circuit_norms(pb, l).max()) for l in layers] if head_warm is not None else []
        late = warm is not None and not problem.factored
        mlp_names = {n for l in layers for n in mlp_matrices(l)} if late else set()
        spec_blocks = problem.spec_blocks
        return cls(
            problem=problem,
            mlp=warm,
            heads=head_warm,
            head_norms=head_norms,
            late=late,
            spec_rest=spec_blocks.restricted_to(set(pb) - mlp_names) if late else spec_blocks,
            spec_mlp={l: spec_blocks.restricted_to(set(mlp_matrices(l))) for l in layers} if late else {},
            pa_rest={k: v for k, v in pa.items() if k not in mlp_names},
            b_norms=circuit_square_norms(pb) if late else None,
            mlp_distance=MlpDistance(pa, pb),
        )

    def linear_share(self, perms: Transform, pb_perm: Params, layer: int) -> Tensor:
        """A layer's linear_cross_covariance, recomputed only when its MLP permutation moved (pb_perm
        leaves B's MLP matrices as they are: this layer's are permuted here)."""
        pa, pb = self.problem.pa, self.problem.pb
        perm = perms[f"mlp.{layer}"].perm
        kept = self.linear_shares.get(layer)
        if kept is None or not torch.equal(kept[0], perm):
            moved = Transform({f"mlp.{layer}": perms[f"mlp.{layer}"]})
            rows = {**pb_perm, **apply_params(moved, self.spec_mlp[layer], {n: pb[n] for n in mlp_matrices(layer)})}
            kept = self.linear_shares[layer] = (perm.clone(), linear_parts(pa, rows, layer, self.problem.vectors))
        return sum(kept[1].values())

    def rotated_similarity(self, res: dict[str, Element], pb_res: Params, layer: int) -> Tensor:
        """mlp_similarity at the current map, rotating the layer's MLP matrices (kept in `rotated`)."""
        pa, pb = self.problem.pa, self.problem.pb
        mlp_b = {n: pb[n] for n in mlp_matrices(layer)}
        self.rotated[layer] = apply_params(Transform(res), self.spec_mlp[layer], mlp_b)
        return mlp_similarity(pa, {**pb_res, **self.rotated[layer]}, layer)

    def mlp_share(self, res: dict[str, Element], perms: Transform) -> float:
        """The MLP matrices' squared distance at the current map and permutations."""
        pa = self.problem.pa
        r, d2, crosses = self.problem.residual_matrix(Transform(res)), 0.0, {}
        for l in self.problem.layers:
            if l in self.rotated:
                moved = Transform({f"mlp.{l}": perms[f"mlp.{l}"]})
                d2 += self.mlp_distance.direct(l, r, apply_params(moved, self.spec_mlp[l], self.rotated[l]))
            else:  # unchanged permutation: its cross-covariances are the residual step's
                parts = self.linear_shares[l][1]
                reader, writer = mlp_matrices(l)
                crosses[l] = parts["in_w"] * pa[reader].shape[0] + parts["out_w"] * pa[writer].shape[1]
        return d2 + (self.mlp_distance.expanded_total(r, crosses) if crosses else 0.0)


class Objective:
    """The relative distance ||theta_A - T(theta_B)|| / ||theta_A|| over circuit-form parameters (over
    the factored weights where the family has no circuit form), the parts outside the layers included."""

    def __init__(self, problem: MatchingProblem, reuse: Reuse):
        self.problem, self.reuse = problem, reuse
        self.norm = (squared_plain_norm if problem.factored else squared_norm)(problem.pa)  # A's side does not move
        self.a_circuits = None if problem.factored else a_circuit_terms(problem.pa)

    def __call__(
        self, pb_t: Params, t: Transform, mlp_d2: float | None = None, layers_d2: float | None = None
    ) -> float:
        """Objective of transform t, given B's layer weights already transformed by it; with `mlp_d2`,
        the MLP matrices' share (left out of pb_t's comparison); with `layers_d2`, the layers' whole share,
        summed as the search went (LayerDistance: pb_t is not read)."""
        p, out, hidden = self.problem, self.problem.outside, self.problem.hidden
        compared = p.pa if mlp_d2 is None else self.reuse.pa_rest
        if layers_d2 is not None:
            diff = layers_d2
        elif p.factored:
            diff = squared_plain_difference(compared, pb_t)
        else:
            diff = squared_difference(compared, pb_t, self.a_circuits, self.reuse.b_norms)
        diff += out.aa + out.bb - 2 * float((p.residual_matrix(t).double() * out.c_raw).sum()) + out.fixed_diff
        if hidden is None:
            return (max(diff + (mlp_d2 or 0.0), 0.0) / (self.norm + out.aa + out.fixed_norm)) ** 0.5
        diff += hidden.squared_difference(t.get("residual"), t[HEAD_HIDDEN])
        return (max(diff + (mlp_d2 or 0.0), 0.0) / (self.norm + out.aa + out.fixed_norm + hidden.norm)) ** 0.5


class LayerDistance:
    """The factored objective's layer share, ||A's layer - T(B)'s layer||^2 added as each layer's elements
    become final in a search run a layer at a time: the same additions in the same order as the objective's
    own pass (squared_plain_difference over A's layers in order), without computing B's layers again."""

    def __init__(self, problem: MatchingProblem, spec: SymmetrySpec):
        self.problem, self.spec, self.total = problem, spec, 0.0
        self.names: dict[int | None, dict[str, Tensor]] = {}
        for name, a in problem.pa.items():
            self.names.setdefault(layer_of(name), {})[name] = a

    @staticmethod
    def applies(problem: MatchingProblem, reuse: Reuse) -> bool:
        """Whether the layers can be scored as they go: factored, and A's layers in order (their names
        grouped by layer, ascending), so that adding layer by layer is adding in the objective's order."""
        order = [layer_of(name) for name in problem.pa]
        grouped = all(a <= b for a, b in zip(order, order[1:]))
        return problem.factored and not reuse.late and grouped

    def add(self, state: SearchState, layer: int) -> None:
        """The layer's share at the state's current elements (the layer's own are final)."""
        moved = self.problem.transformed(state.perms, self.spec, state.pb_res)
        self.total = squared_plain_difference(self.names[layer], moved, self.total)
