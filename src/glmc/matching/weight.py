"""Weight matching (paper 001 §4.1): data-free alignment of model B to model A.

Each iteration
  1. solves the residual map by Procrustes (or, for `residual="permutation"`, by an assignment)
     on the cross-covariance of every residual-side weight block of A and B, each block weighted
     by 1/(its number of columns); the first iteration uses only the embeddings, positions and the
     classifier/unembedding, later ones every block's attention and MLP weights too;
  2. assigns heads per layer on ||QK_A,i - QK_B,j|| + ||OV_A,j - OV_B,j|| (circuits with the bias
     column), computed from the factored weights without building any D x D circuit;
  3. assigns MLP neurons per layer on the cosine of the rows [W_in | b_in | W_out^T];
  4. where the task head has a hidden state of its own (head_hidden: BERT's masked-LM transform or
     pooler), assigns its units on the exact inner product at the current residual map (HiddenHead).
It stops when the objective, the relative distance between the circuit-form parameters of A and of
transformed B, stops improving, and returns the best transform seen.

Late in a search only the residual map moves, by little. An iteration then keeps what its inputs
did not change: assignments a duality certificate proves still optimal (glmc.matching.warm_assignment:
without recomputing the similarity while the map stays inside a certified radius), each layer's
linear share of the residual step while its MLP permutation stays, and the distance of the MLP
matrices expanded in the map's move (glmc.matching.mlp_distance). `reuse=False` recomputes all of it.

Rotary query/key circuits are not what a Llama-style model computes, so its heads are interpolated
as factored weights, and weight matching minimises the factored distance itself: the residual map by
Procrustes on the cross-covariance of every tensor as it is (with B's current permutations and in-head
maps applied), query heads compared by the distance left after the best in-head maps for each pair of
heads (rotary rotation-scaling per frequency pair with the group's keys, paper 002's rotation and
rescaling with the group's values), key/value groups assigned on the best within-group assignment of
their query heads, then every matched group's in-head maps solved in closed form; gated MLP units are
assigned on the gate rows and a cost their up/down scale leaves unchanged, then the scale is solved.

Models converted from Hugging Face have a mean-zero residual stream (every writer is centred over
the width). With `keep_mean` the orthogonal residual map is restricted to those that fix the
all-ones vector 1, so the aligned model keeps the stream in the hyperplane orthogonal to 1 and its
merges still export to a LayerNorm model (glmc.models.export).

In code, weight_matching is a short driver: a MatchingProblem (what is compared, computed once), a
SearchState, one Reuse object (what late iterations carry over), and one iteration's steps chosen once
for the models at hand (ResidualStep, ApplyResidual, CircuitHeads or GroupedHeads, PlainMlp or GatedMlp,
InHeadMaps for factored heads, HiddenUnits where the head has a hidden state); the assignment solvers
live in glmc.matching.assignment.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch import Tensor

from glmc.alignment import Alignment
from glmc.matching.assignment import PARALLEL_UNITS, assign_layers, group_assignment, projected, warm_layers
from glmc.matching.base import MatchContext, circuit_pairs, require_factored
from glmc.matching.head_hidden import HiddenHead
from glmc.matching.layerwise import LayerwiseParams
from glmc.matching.mlp_distance import MlpDistance, mlp_matrices
from glmc.matching.projections import polar_factor
from glmc.matching.rotary_pairs import as_complex, pair_distance, passthrough_cost, rotary_scales, solve_pairs
from glmc.matching.scales import best_scales, scale_objective
from glmc.matching.warm_assignment import WarmAssignments
from glmc.metrics import is_token_task
from glmc.models.canonical import CanonicalTransformer
from glmc.models.export import uncentred_writer
from glmc.models.families import family_named
from glmc.models.families.base import residual_axis
from glmc.models.families.roles import GATED_GROUPED, HEAD_HIDDEN, in_head_pair, layer_of, pair_factors, unit_rows
from glmc.settings.methods import WeightMatcherConfig
from glmc.settings.ranges import check_settings
from glmc.symmetry import (
    Diagonal,
    Orthogonal,
    OrthogonalScale,
    Permutation,
    SymmetrySpec,
    Transform,
    apply,
    apply_params,
)
from glmc.symmetry.family_defaults import resolve_residual
from glmc.symmetry.groups import Element

# assign_layers, group_assignment, projected, PARALLEL_UNITS: imported from here elsewhere too
__all__ = [
    "PARALLEL_UNITS",
    "WeightMatcher",
    "assign_layers",
    "eigen_angles",
    "group_assignment",
    "projected",
    "relative_distance",
    "used_tokens",
    "weight_matching",
]

Params = dict[str, Tensor]


def _aug(p: Params, pre: str, n: str) -> Tensor:
    """[W | b] per head: (H, d, D+1)."""
    return torch.cat([p[pre + n + "_w"], p[pre + n + "_b"][..., None]], -1)


def head_inner(xa: Tensor, ya: Tensor, xb: Tensor, yb: Tensor) -> Tensor:
    """<xa_i^T ya_i, xb_j^T yb_j> for all head pairs (i, j), as <xa_i xb_j^T, ya_i yb_j^T>."""
    gx = torch.einsum("ide,jfe->ijdf", xa, xb)
    gy = torch.einsum("ide,jfe->ijdf", ya, yb)
    return (gx * gy).sum((-1, -2))


def head_inner_diag(xa: Tensor, ya: Tensor, xb: Tensor, yb: Tensor) -> Tensor:
    """The diagonal of head_inner: head i of A against head i of B."""
    gx = torch.einsum("hde,hfe->hdf", xa, xb)
    gy = torch.einsum("hde,hfe->hdf", ya, yb)
    return (gx * gy).sum((-1, -2))


def circuit_factors(p: Params, layer: int) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
    """QK = Q~^T K~ and OV = W_o V~, each as a pair (x, y) with circuit x^T y or y^T x: the head
    costs and distances below are symmetric in x and y."""
    return pair_factors(p, layer, "qk"), pair_factors(p, layer, "vo")


def circuit_cost(pa: Params, pb: Params, layer: int) -> Tensor:
    """Paper 001's head cost ||QK_A,i - QK_B,j||_F + ||OV_A,i - OV_B,j||_F, shape (H_A, H_B)."""
    cost = 0.0
    for (xa, ya), (xb, yb) in zip(circuit_factors(pa, layer), circuit_factors(pb, layer)):
        cross = head_inner(xa, ya, xb, yb)
        na = head_inner_diag(xa, ya, xa, ya)
        nb = head_inner_diag(xb, yb, xb, yb)
        cost = cost + (na[:, None] + nb[None, :] - 2 * cross).clamp_min(0).sqrt()
    return cost


def circuit_norms(p: Params, layer: int) -> Tensor:
    """Per head ||QK_j||_F + ||OV_j||_F (unchanged by the residual map and the head permutation)."""
    return sum(head_inner_diag(x, y, x, y).clamp_min(0).sqrt() for x, y in circuit_factors(p, layer))


def circuit_move(norm: float, moved: float) -> float:
    """How far a head cost can move when the residual map moves by `moved` (spectral norm, or any
    bound above it such as the Frobenius norm): R C R^T
    moves by at most (2 + d) d ||C|| for ||R' - R||_2 <= d, and each cost is 1-Lipschitz in its
    circuits; `norm` is the largest circuit_norms entry."""
    return (2 + moved) * moved * norm


def head_similarity(pa: Params, pb: Params, layer: int) -> Tensor:
    """The negated circuit cost: what the head assignment maximises."""
    return -circuit_cost(pa, pb, layer)


def squared_norm(pa: Params) -> float:
    """||theta_A||^2 over circuit-form parameters (constant during a search: computed once)."""
    norm = sum(float(a.double().pow(2).sum()) for name, a in pa.items() if not in_head_pair(name))
    for layer in {layer_of(n) for n in pa} - {None}:
        for xa, ya in circuit_factors(pa, layer):
            xa, ya = xa.double(), ya.double()
            norm += float(head_inner_diag(xa, ya, xa, ya).sum())
    return norm


def squared_difference(
    pa: Params, pb: Params, a_circuits: dict | None = None, b_norms: dict[int, list[Tensor]] | None = None
) -> float:
    """||theta_A - theta_B||^2 over circuit-form parameters, heads compared in place. `a_circuits`:
    A's side of every circuit comparison (a_circuit_terms), where the caller keeps it; `b_norms`:
    B's squared circuit norms per layer (circuit_square_norms), where the caller keeps them (the
    residual map and the head permutation leave them unchanged)."""
    diff = 0.0
    for name, a in pa.items():
        if in_head_pair(name):  # compared as circuits below
            continue
        diff += float((a - pb[name]).double().pow(2).sum())
    a_circuits = a_circuit_terms(pa) if a_circuits is None else a_circuits
    for layer, terms in a_circuits.items():
        for i, (((xa, ya), aa), fb) in enumerate(zip(terms, circuit_factors(pb, layer))):
            # float64: |A|^2 + |B|^2 - 2<A,B> cancels when the circuits nearly agree
            xb, yb = (t.double() for t in fb)
            bb = head_inner_diag(xb, yb, xb, yb).sum() if b_norms is None else b_norms[layer][i]
            ab = head_inner_diag(xa, ya, xb, yb).sum()
            diff += float(aa + bb - 2 * ab)
    return max(diff, 0.0)


def circuit_square_norms(pb: Params) -> dict[int, list[Tensor]]:
    """Per layer and circuit (qk, vo), the squared Frobenius norm summed over heads, in float64."""
    return {layer: [norm for _, norm in terms] for layer, terms in a_circuit_terms(pb).items()}


def a_circuit_terms(pa: Params) -> dict[int, list[tuple[tuple[Tensor, Tensor], Tensor]]]:
    """Per layer and circuit, A's factors in float64 and its squared norm: what squared_difference
    compares B's circuits with."""
    out = {}
    for layer in {layer_of(n) for n in pa} - {None}:
        out[layer] = []
        for fa in circuit_factors(pa, layer):
            xa, ya = (t.double() for t in fa)
            out[layer].append(((xa, ya), head_inner_diag(xa, ya, xa, ya).sum()))
    return out


def squared_distance(pa: Params, pb: Params) -> tuple[float, float]:
    """(||theta_A - theta_B||^2, ||theta_A||^2) over circuit-form parameters, heads compared in place."""
    return squared_difference(pa, pb), squared_norm(pa)


def relative_distance(pa: Params, pb: Params) -> float:
    """||theta_A - theta_B|| / ||theta_A|| over the circuit-form parameters."""
    diff, norm = squared_distance(pa, pb)
    return (diff / norm) ** 0.5


def rotary_head_cost(pa: Params, pb: Params, layer: int, rotary_dims: int | None = None) -> Tensor:
    """(H_A, H_B) factored distance between query heads of grouped rotary blocks, each with its group's
    keys and values, left after the best in-head maps for that pair: per frequency pair the rotary
    rotation-scaling on [W_q | b_q] against [W_k | b_k], and paper 002's rotation and rescaling on
    [W_v | b_v] against the head's output columns. Computed from cross moments (float64). `rotary_dims`:
    partial rotary, the dims after the first r compared after the best orthogonal map (passthrough_cost)."""
    pre = f"blocks.{layer}."

    def heads(p: Params) -> tuple[Tensor, ...]:
        aug = lambda n: torch.cat([p[pre + n + "_w"], p[pre + n + "_b"][..., None]], -1).double()  # noqa: E731
        q = aug("q")
        group = q.shape[1]
        per_head = lambda t: t.repeat_interleave(group, 0)  # noqa: E731  a group's rows for each query head
        o = p[pre + "o_w"].flatten(0, 1).transpose(1, 2).double()
        return q.flatten(0, 1), per_head(aug("k")), per_head(aug("v")), o

    qa, ka, va, oa = heads(pa)
    qb, kb, vb, ob = heads(pb)
    rotary = qa.shape[1] if rotary_dims is None else rotary_dims
    za, ua, zb, ub = (as_complex(t[:, :rotary]) for t in (qa, ka, qb, kb))
    moment = lambda x, y: torch.einsum("ifn,jfn->ijf", x, y.conj())  # noqa: E731
    cz, cu = moment(za, zb), moment(ua, ub)
    norms = lambda t: t.abs().pow(2).sum(-1)  # noqa: E731
    P, Q = norms(zb)[None].expand_as(cz.real), norms(ub)[None].expand_as(cz.real)
    w = solve_pairs(cz, cu, P, Q)
    qk = pair_distance(w, cz, cu, P, Q, norms(za)[:, None], norms(ua)[:, None]).sum(-1)
    if rotary < qa.shape[1]:
        qk = qk + passthrough_cost(*(t[:, rotary:] for t in (qa, ka, qb, kb)))
    gv = torch.einsum("ide,jfe->ijdf", va, vb)
    go = torch.einsum("ide,jfe->ijdf", oa, ob)
    u, _, vh = torch.linalg.svd(gv + go)
    r = u @ vh
    pv, po = (r * gv).sum((-1, -2)), (r * go).sum((-1, -2))
    Pv, Po = norms(vb).sum(-1)[None].expand_as(pv), norms(ob).sum(-1)[None].expand_as(pv)
    scale = best_scales(Pv, pv, Po, po).reshape(pv.shape)
    vo = scale_objective(scale, Pv, pv, Po, po) + norms(va).sum(-1)[:, None] + norms(oa).sum(-1)[:, None]
    return (qk + vo).clamp_min(0).sqrt()


def factored_cross_covariance(pa: Params, pb: Params, layout: dict, width: int) -> Tensor:
    """C = sum_t A_t B_t^T over the tensors with a residual axis, that axis first and the rest flattened:
    <O, C> is the factored inner product of A with B's tensors mapped by O (float64)."""
    c = torch.zeros(width, width, dtype=torch.float64)
    for name, a in pa.items():
        axis = residual_axis(layout, name, "out")
        axis = residual_axis(layout, name, "in") if axis is None else axis
        if axis is None:
            continue
        b = pb[name]
        c += a.movedim(axis, 0).reshape(width, -1).double() @ b.movedim(axis, 0).reshape(width, -1).double().T
    return c


def squared_plain_norm(pa: Params) -> float:
    """||theta_A||^2 over the tensors as they are."""
    return sum(float(a.double().pow(2).sum()) for a in pa.values())


def squared_plain_difference(pa: Params, pb: Params) -> float:
    """||theta_A - theta_B||^2 over the tensors as they are."""
    return sum(float((a.double() - pb[n].double()).pow(2).sum()) for n, a in pa.items())


def _gated_rows(p: Params, layer: int, branch: str) -> Tensor:
    """A gated MLP's rows per unit: [W | b] of the gate or in (up) branch, or the out (down) columns."""
    pre = f"blocks.{layer}."
    if branch == "out":
        return p[pre + "out_w"].T
    return torch.cat([p[pre + branch + "_w"], p[pre + branch + "_b"][:, None]], 1)


def gated_mlp_similarity(pa: Params, pb: Params, layer: int) -> Tensor:
    """Units of gated MLPs: cosine of the gate rows plus the product of the cosines of the up rows and
    the down columns, which a unit's scale (and sign) of up against down leaves unchanged."""

    def cosine(branch: str) -> Tensor:
        a, b = (_gated_rows(p, layer, branch) for p in (pa, pb))
        a = a / a.norm(dim=1, keepdim=True).clamp_min(1e-12)
        return a @ (b / b.norm(dim=1, keepdim=True).clamp_min(1e-12)).T

    # in place, the same floats: two (units x units) matrices held instead of four (a 1B model's MLP)
    return cosine("in").mul_(cosine("out")).add_(cosine("gate"))


def unit_scales(pa: Params, pb: Params, layer: int) -> Diagonal:
    """Per unit of a gated MLP (B's units already matched to A's) the non-zero s minimising
    ||up_A - s up_B||^2 + ||down_A - down_B / s||^2, the sign tried both ways."""
    xa, xb = _gated_rows(pa, layer, "in").double(), _gated_rows(pb, layer, "in").double()
    ya, yb = _gated_rows(pa, layer, "out").double(), _gated_rows(pb, layer, "out").double()
    P, Q = xb.pow(2).sum(1), yb.pow(2).sum(1)
    p, q = (xa * xb).sum(1), (ya * yb).sum(1)
    positive, negative = best_scales(P, p, Q, q), best_scales(P, -p, Q, -q)
    flip = scale_objective(negative, P, -p, Q, -q) < scale_objective(positive, P, p, Q, q)
    return Diagonal(torch.where(flip, -negative, positive).float())


def in_head_maps(pa: Params, pb: Params, layers: range, rotary_dims: int | None = None) -> Transform:
    """For grouped rotary blocks interpolated as factored weights: per layer the qk rotation-scalings
    (per frequency pair; orthogonal maps of the dims partial rotary leaves, `rotary_dims`) and vo rotations
    with rescaling (per group) moving B's heads onto A's."""
    from glmc.matching.rotation import closed_form_rotations, optimal_scales  # rotation imports this module

    out = Transform()
    for layer in layers:
        (xa, ya), (xb, yb) = (pair_factors(p, layer, "qk", GATED_GROUPED) for p in (pa, pb))
        out[f"qk.{layer}"] = rotary_scales(xa, ya, xb, yb, rotary_dims=rotary_dims).to(dtype=torch.float32)
        (xa, ya), (xb, yb) = (pair_factors(p, layer, "vo", GATED_GROUPED) for p in (pa, pb))
        rotations = closed_form_rotations(xa, ya, xb, yb)
        scales = optimal_scales(xa, ya, xb, yb, rotations)
        out[f"vo.{layer}"] = OrthogonalScale(rotations.float(), scales.float())
    return out


def _residual_only(model: CanonicalTransformer) -> dict[str, tuple[int, bool]]:
    """The tensors outside the blocks that only the residual map acts on (embeddings, classifier or
    unembedding), in the model's order: name -> (their residual axis, whether their rows are tokens).
    A head's first map that also writes the head's hidden state (HEAD_HIDDEN) is left to HiddenHead."""
    layout = family_named(model.config.family).layout(model.config)
    out = {}
    for name in model.params():
        axis = residual_axis(layout, name, "out")
        axis = residual_axis(layout, name, "in") if axis is None else axis
        if layer_of(name) is None and axis is not None and all(a.space == "residual" for a in layout[name].acts):
            out[name] = (axis, layout[name].vocab_rows)
    return out


def _embedding_blocks(
    pa: Params, pb: Params, residual_only: dict[str, tuple[int, bool]], tokens: Tensor | None = None
) -> Iterator[tuple[Tensor, Tensor]]:
    """Residual-side blocks outside the layers as (D, n) matrices, the residual axis first. `tokens`
    keeps only those rows of the token embedding and the unembedding (ids that occur in the training
    data: the rest of a 50,257-token vocabulary is untrained noise)."""
    for name, (axis, vocab_rows) in residual_only.items():
        a, b = pa[name], pb[name]
        if tokens is not None and vocab_rows:
            a, b = a[tokens], b[tokens]
        yield tuple(t.movedim(axis, 0).reshape(t.shape[axis], -1) for t in (a, b))  # one pair held at a time


def _sum_of_squares(block: Tensor) -> float:
    """The sum of a 2-D block's squared entries, read in place where it or its transpose is
    contiguous (the embedding blocks are transposed views of (rows, width) tables)."""
    flat = (block if block.is_contiguous() else block.T).reshape(-1)
    return float(torch.dot(flat, flat))


def residual_vectors(model: CanonicalTransformer) -> tuple[str, ...]:
    """The block tensors that are one vector written into the stream, as role suffixes in role order:
    the output biases ("o_b", "out_b") and, in post-norm blocks, the LayerNorms' gains and offsets."""
    blocks = family_named(model.config.family).blocks(model.config.form)
    single = [r for r in blocks if len(r.acts) == 1 and r.acts[0].space == "residual" and r.acts[0].side == "out"]
    return tuple(r.name.split(".", 2)[2] for r in single if r.acts[0].axis == 0)


def linear_cross_covariance(
    pa: Params, pb_perm: Params, layer: int, vectors: tuple[str, ...], c: Tensor | float = 0.0
) -> Tensor:
    """c plus one layer's share of block_cross_covariance that is linear in the residual map: its single
    residual vectors and its MLP's readers and writers (it changes only with the MLP's permutation),
    added term by term."""
    for part in linear_parts(pa, pb_perm, layer, vectors, split=True).values():
        c = c + part
    return c


def linear_parts(
    pa: Params, pb_perm: Params, layer: int, vectors: tuple[str, ...], split: bool = False
) -> dict[str, Tensor]:
    """linear_cross_covariance's terms: `vectors` (the single residual vectors, summed, or one term
    each with `split`), and per MLP matrix its cross-covariance M = A^T P B (readers) or A P B^T
    (writers) divided by its number of columns."""
    pre = f"blocks.{layer}."
    outers = {name: torch.outer(pa[pre + name], pb_perm[pre + name]) for name in vectors}
    parts = outers if split else {"vectors": sum(outers.values())}
    for reader in ("in_w", "gate_w") if pre + "gate_w" in pa else ("in_w",):
        parts[reader] = pa[pre + reader].T @ pb_perm[pre + reader] / pa[pre + reader].shape[0]
    parts["out_w"] = pa[pre + "out_w"] @ pb_perm[pre + "out_w"].T / pa[pre + "out_w"].shape[1]
    return parts


def circuit_cross_covariance(
    pa: Params, pb_perm: Params, pb_full: Params, layer: int, c: Tensor | float = 0.0
) -> Tensor:
    """c plus one layer's share of block_cross_covariance from its two-sided QK and OV circuits, one
    side taken at the current residual map (pb_full), added term by term."""
    pre = f"blocks.{layer}."
    n = pa[pre + "q_w"].shape[-1] + 1  # columns of a QK or OV circuit
    # QK rows: q_w^T K~; QK columns: k_w^T Q~; OV rows: W_o V~ (heads already matched).
    for solved, other in (("q", "k"), ("k", "q")):
        inner = torch.einsum("hde,hfe->hdf", _aug(pa, pre, other), _aug(pb_full, pre, other))
        c = c + torch.einsum("hdi,hdf,hfj->ij", pa[pre + solved + "_w"], inner, pb_perm[pre + solved + "_w"]) / n
    inner = torch.einsum("hde,hfe->hdf", _aug(pa, pre, "v"), _aug(pb_full, pre, "v"))
    return c + torch.einsum("hid,hdf,hjf->ij", pa[pre + "o_w"], inner, pb_perm[pre + "o_w"]) / n


def block_cross_covariance(
    pa: Params,
    pb_perm: Params,
    pb_full: Params,
    vectors: tuple[str, ...] = ("o_b", "out_b"),
    linear: Callable[[int], Tensor] | None = None,
) -> Tensor:
    """C = sum_k M_A,k M_B,k^T / n_k over the blocks' weights, so that <O, C> = sum_k <M_A,k, O M_B,k> / n_k.

    pb_perm has the head and MLP permutations applied (the residual side still free); pb_full also
    has the current residual map, used for the other side of the two-sided circuits. The embedding
    blocks do not depend on the permutations and are added once by the caller. `vectors`: the block
    tensors that are single residual vectors (residual_vectors). `linear`: a layer's
    linear_cross_covariance where the caller keeps them (None: computed here, every term added to
    the running sum in turn, as the earlier code did: the same floats)."""
    c = 0.0
    for layer in sorted({int(n.split(".")[1]) for n in pa if n.startswith("blocks.")}):
        c = linear_cross_covariance(pa, pb_perm, layer, vectors, c) if linear is None else c + linear(layer)
        c = circuit_cross_covariance(pa, pb_perm, pb_full, layer, c)
    return c


def mlp_similarity(pa: Params, pb: Params, layer: int) -> Tensor:
    fa, fb = unit_rows(pa, layer, "mlp"), unit_rows(pb, layer, "mlp")
    fa = fa / fa.norm(dim=1, keepdim=True).clamp_min(1e-12)
    fb = fb / fb.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return fa @ fb.T


def stream_is_centred(model: CanonicalTransformer, tol: float = 1e-6) -> bool:
    """Whether every residual writer has zero mean over the width (relative tol): the stream then
    lies in the hyperplane orthogonal to the all-ones vector."""
    return uncentred_writer(model, tol) is None


def ones_complement(width: int) -> Tensor:
    """Orthonormal basis (width, width - 1) of the hyperplane orthogonal to the all-ones vector, float64."""
    m = torch.eye(width, dtype=torch.float64)
    m[:, 0] = 1.0  # columns 1, e_1, ..., e_{D-1}: QR's first column spans 1, the others its complement
    return torch.linalg.qr(m).Q[:, 1:]


def mean_keeping_projection(c: Tensor, basis: Tensor) -> Tensor:
    """argmax <O, c> over orthogonal O with O 1 = 1, in float64: Q polar(Q^T c Q) Q^T + 1 1^T / D,
    with Q = `basis` (from ones_complement)."""
    width = basis.shape[0]
    inner = Orthogonal.project(basis.T @ c.double() @ basis).matrix
    return basis @ inner @ basis.T + torch.full((width, width), 1.0 / width, dtype=torch.float64)


# The search: a problem computed once (MatchingProblem), where the search stands (SearchState), what late
# iterations carry over (Reuse), and the steps of one iteration, each chosen once for the models at hand.


@dataclass
class Outside:
    """The tensors outside the layers, computed once: the embeddings' and the classifier's share of the
    residual step's cross-covariance (`c_raw`: each block's as it is, for the factored distance; `c`:
    divided by its number of columns) and their squared norms, in float64, and the squared distance
    and norm of the tensors no symmetry acts on (head.b)."""

    c_raw: Tensor | float
    c: Tensor | float
    aa: float
    bb: float
    fixed_diff: float
    fixed_norm: float


# columns of an embedding table converted to float64 at a time (tables up to this wide in one product)
OUTSIDE_COLUMNS = 8192


def _outside(
    pa: Params, pb: Params, residual_only: dict[str, tuple[int, bool]], hidden: HiddenHead | None, tokens: Tensor | None
) -> Outside:
    """Outside's terms from every tensor of A and B (`residual_only`: _residual_only; `hidden`: the head's
    hidden state, whose tensors HiddenHead compares)."""
    c_raw, c, aa, bb = 0.0, 0.0, 0.0, 0.0
    for a, b in _embedding_blocks(pa, pb, residual_only, tokens):  # float64, each block converted once
        product = torch.zeros(a.shape[0], b.shape[0], dtype=torch.float64)
        # a large vocabulary's columns in slices: a whole table in float64 is twice the model's own copy
        for start in range(0, a.shape[1], OUTSIDE_COLUMNS):
            a64, b64 = (t[:, start : start + OUTSIDE_COLUMNS].double() for t in (a, b))
            product += a64 @ b64.T
            aa, bb = aa + _sum_of_squares(a64), bb + _sum_of_squares(b64)
            del a64, b64
        c_raw, c = c_raw + product, c + product / a.shape[1]
        del product
    moving = residual_only.keys() | (hidden.axis.keys() if hidden is not None else set())
    fixed = [n for n in pa if layer_of(n) is None and n not in moving]  # head.b: no symmetry acts
    fixed_diff = sum(float((pa[n] - pb[n]).pow(2).sum()) for n in fixed)
    fixed_norm = sum(float(pa[n].pow(2).sum()) for n in fixed)
    return Outside(c_raw, c, aa, bb, fixed_diff, fixed_norm)


# from this size of B's layer weights the search holds none of their transformed copies whole
LAYERWISE_BYTES = 2**30


def _block_bytes(params: Params) -> int:
    return sum(t.numel() * t.element_size() for t in params.values())


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
    factored: bool  # no circuit form (grouped rotary heads): the factored distance itself is matched
    grouped: bool  # grouped-query attention: key/value groups, query heads within them
    rotary_dims: int | None  # partial rotary: the leading dims of each query/key head that rotate
    layout: dict
    vectors: tuple[str, ...]  # residual_vectors
    outside: Outside
    hidden: HiddenHead | None  # a task head's hidden state (BERT's masked-LM transform, pooler)
    # B's transformed weights computed layer by layer as read, never held whole (glmc.matching.layerwise)
    layerwise: bool = False

    @classmethod
    def build(
        cls,
        model_a: CanonicalTransformer,
        model_b: CanonicalTransformer,
        dtype: torch.dtype,
        tokens: Tensor | None,
        layerwise: bool | None = None,
    ) -> MatchingProblem:
        spec = SymmetrySpec.from_model(model_b)
        pa = {k: v.detach().to(dtype) for k, v in model_a.params().items()}
        pb = {k: v.detach().to(dtype) for k, v in model_b.params().items()}
        hidden = HiddenHead(spec, pa, pb) if HEAD_HIDDEN in spec.spaces else None
        # Embeddings and the classifier only see the residual map: their share of the Procrustes
        # matrix and of the objective is computed once (a GPT-2 vocabulary makes them the costliest part).
        outside = _outside(pa, pb, _residual_only(model_b), hidden, tokens)
        pa = {k: v for k, v in pa.items() if layer_of(k) is not None}
        pb = {k: v for k, v in pb.items() if layer_of(k) is not None}
        family = family_named(model_b.config.family)
        return cls(
            pa=pa,
            pb=pb,
            spec=spec,
            spec_blocks=spec.restricted_to(set(pb)),
            layers=range(model_a.num_layers),
            width=model_a.width,
            dtype=dtype,
            factored=not family.circuit_form,
            grouped=family.attention_kind == "grouped",
            rotary_dims=model_b.config.rotary_dims,
            layout=family.layout(model_b.config),
            vectors=residual_vectors(model_b),
            outside=outside,
            hidden=hidden,
            layerwise=_block_bytes(pb) > LAYERWISE_BYTES if layerwise is None else layerwise,
        )

    def transformed(self, transform: Transform, spec: SymmetrySpec, source: Params) -> Params:
        """`source` (B's layer weights, or B's under another transform) under `transform`: whole, or
        layer by layer as read for large models."""
        if self.layerwise:
            return LayerwiseParams(source, transform, spec)
        return apply_params(transform, spec, source)

    @property
    def gated(self) -> bool:
        """Whether the MLPs are gated: their units carry an up/down scale."""
        return f"mlp_scale.{self.layers[0]}" in self.spec.spaces

    def residual_matrix(self, t: dict[str, Element]) -> Tensor:
        """The residual map of t as a dense matrix (the identity without one)."""
        g = t.get("residual")
        if g is None:
            return torch.eye(self.width, dtype=self.dtype)
        return g.dense(self.dtype) if isinstance(g, Permutation) else g.matrix.to(self.dtype)


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


def _start(problem: MatchingProblem, residual: str, heads: bool, mlp: bool) -> SearchState:
    """The identity of every space searched over."""
    spec, layers = problem.spec, problem.layers
    perms = Transform()
    if heads:
        perms.update({f"heads.{l}": Permutation.identity(spec[f"heads.{l}"].size) for l in layers})
        if problem.grouped:
            query_heads = [spec[f"qheads.{l}"] for l in layers]
            perms.update({q.name: Permutation.identity(q.size, q.heads) for q in query_heads})
    if mlp:
        perms.update({f"mlp.{l}": Permutation.identity(spec[f"mlp.{l}"].size) for l in layers})
        if problem.gated:
            perms.update({f"mlp_scale.{l}": Diagonal.identity(spec[f"mlp_scale.{l}"].size) for l in layers})
    res = {}
    if residual == "orthogonal":
        res = {"residual": Orthogonal(torch.eye(problem.width, dtype=problem.dtype))}
    elif residual == "permutation":
        res = {"residual": Permutation.identity(problem.width)}
    hidden = problem.hidden
    head = {} if hidden is None else {HEAD_HIDDEN: Permutation.identity(hidden.size)}
    # the identity leaves every weight as it is (exactly: products with ones and zeros): B's own
    # weights, not a product over all of them
    return SearchState(res, perms, head, dict(problem.pb))


@dataclass
class Reuse:
    """What late iterations keep from one iteration to the next (weight_matching's `reuse`).

    Head and MLP assignments carry over while a certificate says they are still optimal (`heads`,
    `mlp`: glmc.matching.warm_assignment). On the `late` path (large circuit-form MLPs with certified
    assignments) B's MLP matrices are rotated only for the layers whose similarity is computed
    (`rotated`, per iteration), their distance is expanded in the map's move (`mlp_distance`), the
    residual step keeps each layer's linear share while its MLP permutation stays (`linear_shares`)
    and takes the polar factor from the Gram matrix (until that failed twice in a row: `gram_misses`).
    Smaller models keep the plain arithmetic (the same floats, so learned matching, which starts from
    them, retraces its runs), where these would save little."""

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
        # MLP cosines move by at most the residual map's move: their assignments carry over (not for the
        # gated MLPs' cost, nor without a residual map to measure the move by); below PARALLEL_UNITS
        # units the solver is as cheap as the certificates
        big = mlp and spec[f"mlp.{layers[0]}"].size >= PARALLEL_UNITS
        warm = WarmAssignments() if reuse and big and not problem.gated and residual != "none" else None
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

    def __call__(self, pb_t: Params, t: Transform, mlp_d2: float | None = None) -> float:
        """Objective of transform t, given B's layer weights already transformed by it; with `mlp_d2`,
        the MLP matrices' share (left out of pb_t's comparison)."""
        p, out, hidden = self.problem, self.problem.outside, self.problem.hidden
        compared = p.pa if mlp_d2 is None else self.reuse.pa_rest
        if p.factored:
            diff = squared_plain_difference(compared, pb_t)
        else:
            diff = squared_difference(compared, pb_t, self.a_circuits, self.reuse.b_norms)
        diff += out.aa + out.bb - 2 * float((p.residual_matrix(t).double() * out.c_raw).sum()) + out.fixed_diff
        if hidden is None:
            return (max(diff + (mlp_d2 or 0.0), 0.0) / (self.norm + out.aa + out.fixed_norm)) ** 0.5
        diff += hidden.squared_difference(t.get("residual"), t[HEAD_HIDDEN])
        return (max(diff + (mlp_d2 or 0.0), 0.0) / (self.norm + out.aa + out.fixed_norm + hidden.norm)) ** 0.5


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
        self.basis = ones_complement(problem.width) if keep_mean and residual == "orthogonal" else None

    def __call__(self, state: SearchState, it: int) -> None:
        p = self.problem
        c = p.outside.c_raw if p.factored else p.outside.c
        if it > 0:  # the first iteration sees only the embeddings and the classifier
            c = c + self.block_share(state)
            if p.hidden is not None:  # the head's first map, its rows in the hidden order found so far
                c = c + p.hidden.residual_cross(state.head[HEAD_HIDDEN], p.width, raw=p.factored)
        state.res = {"residual": self.project(c)}

    def block_share(self, state: SearchState) -> Tensor:
        """The layers' share of the cross-covariance at the current permutations."""
        p, reuse = self.problem, self.reuse
        pb_perm = p.transformed(state.perms, reuse.spec_rest, p.pb)  # late: B's MLP matrices as they are
        if p.factored:
            return factored_cross_covariance(p.pa, pb_perm, p.layout, p.width)
        linear = partial(reuse.linear_share, state.perms, pb_perm) if reuse.late else None
        return block_cross_covariance(p.pa, pb_perm, state.pb_cur, p.vectors, linear)

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


class CircuitHeads(Step):
    """Heads per layer on paper 001's circuit cost, the assignments certified ones carry over where
    reuse keeps them."""

    name = "heads"

    def __call__(self, state: SearchState, it: int) -> None:
        p, warm = self.problem, self.reuse.heads
        similarity = partial(head_similarity, p.pa, state.pb_res)
        if warm is None:
            solved = assign_layers(partial(projected, similarity), p.layers, 1)
            state.perms.update(zip((f"heads.{l}" for l in p.layers), solved))
            return
        r = p.residual_matrix(Transform(state.res))
        for l in p.layers:
            within = partial(circuit_move, self.reuse.head_norms[l])
            state.perms[f"heads.{l}"] = warm.solve(r, similarity, l, within)


class GroupedHeads(Step):
    """Key/value groups and their query heads per layer (group_assignment), on the factored distance
    left after the best in-head maps (rotary_head_cost) or, with a circuit form, the circuit cost."""

    name = "heads"

    def __call__(self, state: SearchState, it: int) -> None:
        p = self.problem
        head_cost = partial(rotary_head_cost, rotary_dims=p.rotary_dims) if p.factored else circuit_cost
        for l in p.layers:
            cost = head_cost(p.pa, state.pb_res, l)
            state.perms[f"heads.{l}"], state.perms[f"qheads.{l}"] = group_assignment(cost, p.spec[f"heads.{l}"].size)


class PlainMlp(Step):
    """MLP units per layer on the cosine of the rows [W_in | b_in | W_out^T]; the layers' problems are
    independent, so their Hungarian solves run side by side (`threads`) from PARALLEL_UNITS units."""

    name = "mlp"

    def __init__(self, problem: MatchingProblem, reuse: Reuse, threads: int | None):
        super().__init__(problem, reuse)
        # a pool pays for itself from about a thousand units (a GPT-2's MLP), not on small models
        self.pool = threads if problem.spec[f"mlp.{problem.layers[0]}"].size >= PARALLEL_UNITS else 1

    def __call__(self, state: SearchState, it: int) -> None:
        p, warm = self.problem, self.reuse.mlp
        similarity = self.similarity(state)
        if warm is None:
            solved = assign_layers(partial(projected, similarity), p.layers, self.pool)
        else:  # the layers' last assignments while certified; the map is what the similarities depend on
            solved = warm_layers(warm, p.residual_matrix(Transform(state.res)), similarity, p.layers, self.pool)
        state.perms.update(zip((f"mlp.{l}" for l in p.layers), solved))

    def similarity(self, state: SearchState) -> Callable[[int], Tensor]:
        if self.reuse.late:  # B's MLP matrices rotated only for the layers it is asked for
            return partial(self.reuse.rotated_similarity, state.res, state.pb_res)
        return partial(mlp_similarity, self.problem.pa, state.pb_res)


class GatedMlp(PlainMlp):
    """Gated MLP units on the gate rows and a cost their up/down scale leaves unchanged, then that scale
    (no certificates: that cost is not a cosine the residual map rotates)."""

    def __call__(self, state: SearchState, it: int) -> None:
        p = self.problem
        super().__call__(state, it)
        units = Transform({f"mlp.{l}": state.perms[f"mlp.{l}"] for l in p.layers})
        moved = p.transformed(units, p.spec_blocks, state.pb_res)
        state.perms.update({f"mlp_scale.{l}": unit_scales(p.pa, moved, l) for l in p.layers})

    def similarity(self, state: SearchState) -> Callable[[int], Tensor]:
        return partial(gated_mlp_similarity, self.problem.pa, state.pb_res)


class InHeadMaps(Step):
    """Factored heads: the in-head maps of the groups just matched decide which factored weights compare."""

    name = "in_head"

    def __call__(self, state: SearchState, it: int) -> None:
        p = self.problem
        matched = Transform({k: g for k, g in state.perms.items() if k.startswith(("heads.", "qheads."))})
        moved = p.transformed(matched, p.spec_blocks, state.pb_res)
        state.perms.update(in_head_maps(p.pa, moved, p.layers, p.rotary_dims))


class HiddenUnits(Step):
    """The head's hidden units on the exact inner product at the current residual map (HiddenHead);
    not timed (one small assignment per iteration)."""

    def __call__(self, state: SearchState, it: int) -> None:
        state.head = {HEAD_HIDDEN: self.problem.hidden.solve(state.res.get("residual"))}


def _steps(
    problem: MatchingProblem, reuse: Reuse, residual: str, keep_mean: bool, heads: bool, mlp: bool, threads: int | None
) -> list[Step]:
    """One iteration's steps, in order, each chosen once for the models at hand."""
    steps: list[Step] = [] if residual == "none" else [ResidualStep(problem, reuse, residual, keep_mean)]
    steps.append(ApplyResidual(problem, reuse))
    if heads:
        steps.append((GroupedHeads if problem.grouped else CircuitHeads)(problem, reuse))
    if mlp:
        steps.append((GatedMlp if problem.gated else PlainMlp)(problem, reuse, threads))
    if problem.factored:
        steps.append(InHeadMaps(problem, reuse))
    if problem.hidden is not None:
        steps.append(HiddenUnits(problem, reuse))
    return steps


def _iteration(steps: list[Step], objective: Objective, state: SearchState, it: int) -> tuple[float, Transform]:
    """Runs one iteration's steps, then B's weights under the new transform; returns its objective and
    the transform."""
    for step in steps:
        tick = time.perf_counter()
        step(state, it)
        if step.name is not None:
            state.seconds[step.name] += time.perf_counter() - tick
    current = state.transform()
    tick = time.perf_counter()
    reuse = objective.reuse
    state.pb_cur = None  # B's weights are held at most twice more at a time (1B-parameter models)
    state.pb_cur = objective.problem.transformed(state.perms, reuse.spec_rest, state.pb_res)
    if not objective.problem.layerwise:
        state.pb_res = None  # layerwise: pb_cur reads it
    value = objective(state.pb_cur, current, reuse.mlp_share(state.res, state.perms) if reuse.late else None)
    reuse.rotated = {}
    state.seconds["objective"] += time.perf_counter() - tick
    return value, current


def _search(
    steps: list[Step], objective: Objective, state: SearchState, max_iter: int, tol: float
) -> tuple[Transform, float, list[float], list[float]]:
    """Iterates from the state until the objective stops improving; returns the best transform seen, its
    objective, the objective at the start and after each iteration, and each iteration's seconds."""
    best_t = state.transform()
    best = objective(state.pb_cur, best_t)
    values: list[float] = [best]
    per_iteration: list[float] = []
    for it in range(max_iter):
        started = time.perf_counter()
        value, current = _iteration(steps, objective, state, it)
        values.append(value)
        per_iteration.append(time.perf_counter() - started)
        improved = best - value
        if value < best:
            best, best_t = value, Transform(current)
        # the first iteration saw only the embeddings: always let the full objective run once
        if it > 0 and improved <= tol * max(best, 1e-12):
            break
    return best_t, best, values, per_iteration


def _diagnostics(
    best_t: Transform, best: float, values: list[float], per_iteration: list[float], state: SearchState, reuse: Reuse
) -> dict[str, Any]:
    diagnostics: dict[str, Any] = {
        "objective": values,
        "iterations": len(values) - 1,
        "seconds_by_step": dict(state.seconds),
        "seconds_by_iteration": per_iteration,
        "final_distance": best,
    }
    # how many layer-iterations of MLP and head assignment were skipped, certified, solved
    if reuse.mlp is not None:
        diagnostics["mlp_assignments"] = dict(reuse.mlp.counts)
    if reuse.heads is not None:
        diagnostics["head_assignments"] = dict(reuse.heads.counts)
    if isinstance(best_t.get("residual"), Orthogonal):  # paper 001 Fig. 5: how far from the identity
        diagnostics["residual_angles"] = eigen_angles(best_t["residual"].matrix)
    return diagnostics


def weight_matching(
    model_a: CanonicalTransformer,
    model_b: CanonicalTransformer,
    residual: str = "orthogonal",
    heads: bool = True,
    mlp: bool = True,
    max_iter: int = 15,
    tol: float = 1e-6,
    dtype: torch.dtype = torch.float32,
    tokens: Tensor | None = None,
    keep_mean: bool = False,
    threads: int | None = None,
    reuse: bool = True,
    layerwise: bool | None = None,
) -> tuple[Transform, dict[str, Any]]:
    """Transform T with T(B) close to A in weight space; diagnostics hold the per-iteration objective.

    The search runs in `dtype`; the Procrustes projection and the objective's cancellations are
    computed in float64. float32 recovers a hidden symmetry to a relative distance of about 1e-5,
    float64 to 1e-7. The returned elements are float32; `apply` uses them in float64. `tokens`: the
    vocabulary rows that enter the residual map and the objective (None: all). `keep_mean`: an
    orthogonal residual map fixes the all-ones vector and its complement (for mean-zero streams;
    permutations always do). `threads`: how many layers' MLP assignments (of PARALLEL_UNITS units or more)
    are solved at once (None: torch's thread count; 1: one after another, the same solutions).
    `reuse`: skip the work whose inputs did not change: head and MLP assignments while a certificate
    says they are still optimal (glmc.matching.warm_assignment) and, from PARALLEL_UNITS MLP units,
    a layer's linear share of the residual step while its MLP permutation stays and the MLP
    matrices' rotation (their distance expanded in the map's move, glmc.matching.mlp_distance);
    False recomputes everything every iteration. `layerwise`: B's transformed weights are computed layer
    by layer as each step reads them, never held whole (glmc.matching.layerwise; the same floats); None:
    from LAYERWISE_BYTES of layer weights."""
    if residual not in ("orthogonal", "permutation", "none"):
        raise ValueError(f"residual={residual!r} is not one of orthogonal, permutation, none")
    if model_a.config.form != "factored" or model_b.config.form != "factored":
        raise ValueError("weight matching reads factored heads: pass models before .to_circuit()")
    problem = MatchingProblem.build(model_a, model_b, dtype, tokens, layerwise)
    state = _start(problem, residual, heads, mlp)
    carried = Reuse.build(problem, residual, heads, mlp, reuse)
    steps = _steps(problem, carried, residual, keep_mean, heads, mlp, threads)
    best_t, best, values, per_iteration = _search(steps, Objective(problem, carried), state, max_iter, tol)
    best_t = best_t.to(dtype=torch.float32)
    return best_t, _diagnostics(best_t, best, values, per_iteration, state, carried)


def eigen_angles(matrix: Tensor) -> list[float]:
    """The angles |arg z| in [0, pi] of an orthogonal matrix's eigenvalues z, ascending: a rotation by
    t in a plane gives t twice (z and its conjugate), a reflected direction pi, a fixed one 0.

    Q - I is normal with eigenvalues z - 1, so its singular values are |z - 1| = 2 sin(t / 2): a
    symmetric problem (eight times cheaper than the general eigenvalues at width 512), exact near
    t = 0 and to about 1e-8 next to pi."""
    q = matrix.detach().cpu().double()
    sines = torch.linalg.svdvals(q - torch.eye(len(q), dtype=q.dtype)).mul(0.5).clamp(max=1.0)
    return sorted(float(a) for a in 2 * torch.asin(sines))


class WeightMatcher:
    """`weight`: orthogonal residual + head and MLP permutations; `weight_perm`: all permutations.

    heads / mlp: "permutation" or "none"; qk / vo: "circuit" interpolates those attention pairs as
    circuits (the in-head invertible symmetries are quotiented out), "none" as factored weights.
    keep_mean (orthogonal residual only): "auto" keeps the all-ones vector fixed when both models'
    streams are mean-zero (Hugging Face conversions), "always" requires that, "never" solves the
    unrestricted Procrustes problem."""

    def __init__(
        self,
        name: str = "weight",
        residual: str = "auto",
        heads: str = "permutation",
        mlp: str = "permutation",
        qk: str = "circuit",
        vo: str = "circuit",
        max_iter: int = 15,
        tol: float = 1e-6,
        vocabulary: str = "train",
        keep_mean: str = "never",
    ):
        check_settings(WeightMatcherConfig, f"matcher.{name}", locals())  # the ranges glmc.settings declares
        self.keep_mean = keep_mean
        self.name, self.residual, self.heads, self.mlp = name, residual, heads != "none", mlp != "none"
        self.circuits, self.max_iter, self.tol, self.vocabulary = circuit_pairs(qk, vo), max_iter, tol, vocabulary

    def match(self, a: CanonicalTransformer, b: CanonicalTransformer, context: MatchContext | None = None) -> Alignment:
        require_factored(self.name, a, b)
        tokens = used_tokens(b, context) if self.vocabulary == "train" else None
        residual = resolve_residual(self.residual, family_named(a.config.family))[0]  # auto: the family's widest
        keep_mean = self.resolve_keep_mean(a, b, residual)
        transform, diagnostics = weight_matching(
            a, b, residual, self.heads, self.mlp, self.max_iter, self.tol, tokens=tokens, keep_mean=keep_mean
        )
        diagnostics["keep_mean"] = keep_mean
        if tokens is not None:
            diagnostics["vocabulary_rows"] = int(tokens.numel())
        return Alignment(
            reference=a, model=apply(transform, b), transform=transform, circuits=self.circuits, diagnostics=diagnostics
        )

    def resolve_keep_mean(self, a: CanonicalTransformer, b: CanonicalTransformer, residual: str) -> bool:
        """Whether the orthogonal residual map is restricted to fix the all-ones vector."""
        if self.keep_mean == "never" or residual != "orthogonal":
            return False  # permutations fix 1 anyway
        for label, model in (("A", a), ("B", b)):
            name = uncentred_writer(model)
            if name is None:
                continue
            if self.keep_mean == "always":
                raise ValueError(
                    f"matcher.{self.name}.keep_mean=always but model {label}'s residual stream is not mean-zero "
                    f"({name} has a non-zero mean over the width): use keep_mean=auto or never"
                )
            return False
        return True


def used_tokens(model: CanonicalTransformer, context: MatchContext | None) -> Tensor | None:
    """For a language model with training data in the context: the ids that occur in it (paper 001's
    restriction of the embedding rows). None for image models or without data."""
    if not is_token_task(model.task) or context is None or context.data is None:
        return None
    vocab = family_named(model.config.family).input_limits(model.params())["vocab"]
    return context.token_ids(vocab, inputs=model.task == "masked_lm")
