"""The steps of one weight-matching iteration (glmc.matching.weight), each chosen once for the models
at hand: the residual map, B under it, heads, MLP units, the steps the models' block kinds add for spaces
of their own (BlockKind.weight_step), in-head maps, the head's hidden units."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

from torch import Tensor

from glmc.matching.engine.assignment import PARALLEL_UNITS, assign_layers, group_assignment, projected, warm_layers
from glmc.matching.engine.circuits import circuit_cost, circuit_move, head_similarity
from glmc.matching.engine.in_head import in_head_maps, rotary_head_cost
from glmc.matching.engine.mlp_units import gated_mlp_similarity, mlp_similarity, unit_scales
from glmc.matching.engine.problem import MatchingProblem, Reuse, SearchState
from glmc.matching.engine.projections import polar_factor
from glmc.matching.engine.relu_units import positive_unit_scales, scaled_mlp_similarity
from glmc.matching.engine.residual_map import (
    block_cross_covariance,
    factored_cross_covariance,
    mean_keeping_projection,
    ones_complement,
)
from glmc.models.blocks.registry import BlockKind, hook
from glmc.models.families.roles import HEAD_HIDDEN, HEAD_PAIRS
from glmc.symmetry import Orthogonal, Permutation, Transform
from glmc.symmetry.groups import Element, SignedPermutation


class Step:
    """One part of an iteration, updating the search state; `name` keys its time in the diagnostics
    (None: not timed)."""

    name: str | None = None

    def __init__(self, problem: MatchingProblem, reuse: Reuse):
        self.problem, self.reuse = problem, reuse

    def __call__(self, state: SearchState, it: int) -> None:
        raise NotImplementedError


class ResidualStep(Step):
    """The residual map by Procrustes (or an assignment, for `residual="permutation"`) on the
    cross-covariance of A's and B's residual-side weights; the first iteration sees only the
    embeddings and the classifier."""

    name = "residual"

    def __init__(self, problem: MatchingProblem, reuse: Reuse, residual: str, keep_mean: bool):
        super().__init__(problem, reuse)
        self.residual = residual
        keeps = keep_mean and residual == "orthogonal"
        self.basis = ones_complement(problem.width, problem.device) if keeps else None

    def __call__(self, state: SearchState, it: int) -> None:
        p = self.problem
        c = p.outside.c_raw if p.factored else p.outside.c
        if it > 0:  # the first iteration sees only the embeddings and the classifier
            c = c + self.block_share(state)
            if p.hidden is not None:  # the head's first map, its rows in the hidden order found so far
                c = c + p.hidden.residual_cross(state.head[HEAD_HIDDEN], p.width, raw=p.factored)
        if self.residual == "signed_permutation":  # the gains' share carries no sign (apply's Axis.gain)
            gains = self.gain_share(state) if it > 0 else 0.0
            state.res = {"residual": SignedPermutation.project(c - gains, gains).to(dtype=self.problem.dtype)}
            return
        state.res = {"residual": self.project(c)}

    def block_share(self, state: SearchState) -> Tensor:
        """The layers' share of the cross-covariance at the current permutations."""
        p, reuse = self.problem, self.reuse
        pb_perm = p.transformed(state.perms, reuse.spec_rest, p.pb)  # late: B's MLP matrices as they are
        if p.factored:
            return factored_cross_covariance(p.pa, pb_perm, p.layout, p.width)
        linear = partial(reuse.linear_share, state.perms, pb_perm) if reuse.late else None
        return block_cross_covariance(p.pa, pb_perm, state.pb_cur, p.vectors, linear)

    def gain_share(self, state: SearchState) -> Tensor | float:
        """The part of the block share from the stream's gains (block_share's terms of those tensors alone)."""
        p = self.problem
        if not p.gains:
            return 0.0
        pa = {n: p.pa[n] for n in p.gains}
        pb = {n: p.pb[n] for n in p.gains}  # the heads and units leave a gain on the stream as it is
        return factored_cross_covariance(pa, pb, p.layout, p.width)  # the outer products block_share sums

    def project(self, c: Tensor) -> Element:
        """The residual map maximising <map, c>; the polar factor in float64: its error grows with the
        conditioning of c."""
        if self.residual == "permutation":
            return Permutation.project(c)
        if self.basis is not None:
            return Orthogonal(mean_keeping_projection(c, self.basis).to(self.problem.dtype))
        reuse = self.reuse
        matrix, served = polar_factor(c.double(), reuse.late and reuse.gram_misses < 2)
        reuse.gram_misses = 0 if served else reuse.gram_misses + 1
        return Orthogonal(matrix.to(self.problem.dtype))


class ApplyResidual(Step):
    """B's layer weights under the new residual map: the only dense contraction of an iteration (the
    permutations on top of it are index gathers)."""

    name = "apply"

    def __call__(self, state: SearchState, it: int) -> None:
        state.pb_res = self.problem.transformed(Transform(state.res), self.reuse.spec_rest, self.problem.pb)
        self.reuse.rotated = {}  # late: the layers whose MLP matrices are rotated this iteration


class LayerStep(Step):
    """A step whose layers are independent once the residual map is set (heads, MLP units, in-head maps):
    a large search runs the layers of consecutive such steps together (weight._run_layers), so that each
    of B's transformed layers is computed once per iteration rather than once per step. `begin` returns
    what the layers share this iteration, handed to each `layer` call and dropped after the last."""

    def begin(self, state: SearchState, it: int) -> Any:
        return None

    def layer(self, state: SearchState, it: int, l: int, shared: Any) -> None:
        raise NotImplementedError

    def __call__(self, state: SearchState, it: int) -> None:
        shared = self.begin(state, it)
        for l in self.problem.layers:
            self.layer(state, it, l, shared)


class CircuitHeads(LayerStep):
    """Heads per layer on paper 001's circuit cost, the assignments certified ones carry over where
    reuse keeps them."""

    name = "heads"

    def begin(self, state: SearchState, it: int) -> tuple[Callable[[int], Tensor], Tensor | None]:
        p = self.problem
        r = None if self.reuse.heads is None else p.residual_matrix(Transform(state.res))
        return partial(head_similarity, p.pa, state.pb_res), r

    def layer(self, state: SearchState, it: int, l: int, shared: Any) -> None:
        (similarity, r), warm = shared, self.reuse.heads
        if warm is None:
            state.perms[f"heads.{l}"] = projected(similarity, l)
        else:
            state.perms[f"heads.{l}"] = warm.solve(r, similarity, l, partial(circuit_move, self.reuse.head_norms[l]))


class GroupedHeads(LayerStep):
    """Key/value groups and their query heads per layer (group_assignment), on the factored distance
    left after the best in-head maps (rotary_head_cost) or, with a circuit form, the circuit cost."""

    name = "heads"

    def begin(self, state: SearchState, it: int) -> Callable:
        p = self.problem
        rotary = partial(rotary_head_cost, rotary_dims=p.rotary_dims, qk_maps="qk" in head_pairs(p))
        return rotary if p.factored else circuit_cost

    def layer(self, state: SearchState, it: int, l: int, shared: Any) -> None:
        p = self.problem
        cost = shared(p.pa, state.pb_res, l)
        state.perms[f"heads.{l}"], query_heads = group_assignment(cost, p.spec[f"heads.{l}"].size)
        if f"qheads.{l}" in p.spec.spaces:  # no space where each group has one query head
            state.perms[f"qheads.{l}"] = query_heads


class PlainMlp(LayerStep):
    """MLP units per layer on the cosine of the rows [W_in | b_in | W_out^T]; the layers' problems are
    independent, so their Hungarian solves run side by side (`threads`) from PARALLEL_UNITS units."""

    name = "mlp"

    def __init__(self, problem: MatchingProblem, reuse: Reuse, threads: int | None):
        super().__init__(problem, reuse)
        # a pool pays for itself from about a thousand units (a GPT-2's MLP), not on small models; a large
        # model's layers are solved one at a time (each solve holds a few units x units matrices)
        big = problem.spec[f"mlp.{problem.layers[0]}"].size >= PARALLEL_UNITS
        self.pool = threads if big and not problem.layerwise else 1

    def __call__(self, state: SearchState, it: int) -> None:
        if self.pool is not None and self.pool <= 1:
            super().__call__(state, it)
            return
        p, warm = self.problem, self.reuse.mlp
        similarity = self.similarity(state)
        if warm is None:
            solved = assign_layers(partial(projected, similarity), p.layers, self.pool)
        else:  # the layers' last assignments while certified; the map is what the similarities depend on
            solved = warm_layers(warm, p.residual_matrix(Transform(state.res)), similarity, p.layers, self.pool)
        state.perms.update(zip((f"mlp.{l}" for l in p.layers), solved))
        self.after(state, p.layers)

    def begin(self, state: SearchState, it: int) -> tuple[Callable[[int], Tensor], Tensor | None]:
        r = None if self.reuse.mlp is None else self.problem.residual_matrix(Transform(state.res))
        return self.similarity(state), r

    def layer(self, state: SearchState, it: int, l: int, shared: Any) -> None:
        (similarity, r), warm = shared, self.reuse.mlp
        state.perms[f"mlp.{l}"] = projected(similarity, l) if warm is None else warm_layers(warm, r, similarity, [l])[0]
        self.after(state, [l])

    def after(self, state: SearchState, layers: Sequence[int]) -> None:
        """What follows the layers' units (nothing for plain MLPs)."""

    def similarity(self, state: SearchState) -> Callable[[int], Tensor]:
        if self.reuse.late:  # B's MLP matrices rotated only for the layers it is asked for
            return partial(self.reuse.rotated_similarity, state.res, state.pb_res)
        return partial(mlp_similarity, self.problem.pa, state.pb_res)


class GatedMlp(PlainMlp):
    """Gated MLP units on the gate rows and a cost their up/down scale leaves unchanged (`cost`), then that
    scale (`scales`; no certificates: that cost is not a cosine the residual map rotates)."""

    cost = staticmethod(gated_mlp_similarity)
    scales = staticmethod(unit_scales)

    def after(self, state: SearchState, layers: Sequence[int]) -> None:
        p = self.problem
        units = Transform({f"mlp.{l}": state.perms[f"mlp.{l}"] for l in layers})
        moved = p.transformed(units, p.spec_blocks, state.pb_res)
        state.perms.update({f"mlp_scale.{l}": self.scales(p.pa, moved, l) for l in layers})

    def similarity(self, state: SearchState) -> Callable[[int], Tensor]:
        return partial(self.cost, self.problem.pa, state.pb_res)


class ScaledMlp(GatedMlp):
    """Plain ReLU-like units on a cost their positive scales leave unchanged, then those scales (no
    certificates: a sum of two cosines moves by up to twice the map's move)."""

    cost = staticmethod(scaled_mlp_similarity)
    scales = staticmethod(positive_unit_scales)


class InHeadMaps(LayerStep):
    """Factored heads: the in-head maps of the groups just matched decide which factored weights compare."""

    name = "in_head"

    def layer(self, state: SearchState, it: int, l: int, shared: Any) -> None:
        p = self.problem
        matched = Transform({k: state.perms[k] for k in (f"heads.{l}", f"qheads.{l}") if k in state.perms})
        moved = p.transformed(matched, p.spec_blocks, state.pb_res)
        state.perms.update(in_head_maps(p.pa, moved, [l], p.rotary_dims, head_pairs(p)))


class HiddenUnits(Step):
    """The head's hidden units on the exact inner product at the current residual map (HiddenHead);
    not timed (one small assignment per iteration)."""

    def __call__(self, state: SearchState, it: int) -> None:
        state.head = {HEAD_HIDDEN: self.problem.hidden.solve(state.res.get("residual"))}


def head_pairs(problem: MatchingProblem) -> frozenset[str]:
    """The per-head spaces (qk, vo) the model's roles declare: a block without one keeps no such maps."""
    return frozenset(s.kind for s in problem.spec if s.kind in HEAD_PAIRS)


def kind_steps(problem: MatchingProblem, kinds: tuple[BlockKind, ...], options: Mapping[str, Any]) -> list:
    """The steps the block kinds declare (BlockKind.weight_step) for a search with these options."""
    made = (hook(kind.weight_step)(problem, options) for kind in kinds if kind.weight_step is not None)
    return [step for step in made if step is not None]


def iteration_steps(
    problem: MatchingProblem,
    reuse: Reuse,
    residual: str,
    keep_mean: bool,
    heads: bool,
    mlp: bool,
    threads: int | None,
    kinds: tuple[BlockKind, ...] = (),
    options: Mapping[str, Any] | None = None,
) -> list[Step]:
    """One iteration's steps, in order, each chosen once for the models at hand (the MLP units their blocks
    declare, and the steps of their `kinds`); `options`: the matcher's settings for the kinds' steps, which
    also see the heads and mlp flags."""
    steps: list[Step] = [] if residual == "none" else [ResidualStep(problem, reuse, residual, keep_mean)]
    steps.append(ApplyResidual(problem, reuse))
    if heads:
        steps.append((GroupedHeads if problem.grouped else CircuitHeads)(problem, reuse))
    if mlp and f"mlp.{problem.layers[0]}" in problem.spec.spaces:
        units = GatedMlp if problem.gated else ScaledMlp if problem.scaled else PlainMlp
        steps.append(units(problem, reuse, threads))
    steps += kind_steps(problem, kinds, {**(options or {}), "heads": heads, "mlp": mlp})
    if problem.factored and head_pairs(problem):
        steps.append(InHeadMaps(problem, reuse))
    if problem.hidden is not None:
        steps.append(HiddenUnits(problem, reuse))
    return steps
