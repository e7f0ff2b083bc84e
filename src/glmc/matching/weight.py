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
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import torch
from torch import Tensor

from glmc.alignment import Alignment
from glmc.matching.base import MatchContext, circuit_pairs, require_factored
from glmc.matching.head_hidden import HiddenHead
from glmc.matching.mlp_distance import MlpDistance, mlp_matrices
from glmc.matching.projections import polar_factor
from glmc.matching.rotary_pairs import as_complex, pair_distance, rotary_scales, solve_pairs
from glmc.matching.scales import best_scales, scale_objective
from glmc.matching.warm_assignment import WarmAssignments
from glmc.metrics import is_token_task
from glmc.models.canonical import CanonicalTransformer
from glmc.models.export import uncentred_writer
from glmc.models.families import family_named
from glmc.models.families.base import residual_axis
from glmc.models.families.roles import GATED_GROUPED, HEAD_HIDDEN, in_head_pair, layer_of, pair_factors, unit_rows
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


def projected(similarity: Callable[[int], Tensor], layer: int) -> Permutation:
    """The assignment maximising similarity(layer) (Permutation.project)."""
    return Permutation.project(similarity(layer))


# the smallest MLP whose layers' assignments are solved side by side (measured in matching_speed.py: at
# 512 units a thread pool costs what it saves, at 2,048 it saves a fifth of the MLP step)
PARALLEL_UNITS = 1024


def assign_layers(
    solve: Callable[[int], Permutation], layers: Sequence[int], threads: int | None = None
) -> list[Permutation]:
    """Per layer, solve(layer) (an assignment, typically Permutation.project of a similarity). The
    layers' problems are independent and SciPy's Hungarian solver releases the GIL, so `threads`
    layers (None: torch's thread count) are built and solved at once; only that many similarity
    matrices are held at a time."""
    threads = torch.get_num_threads() if threads is None else threads
    if threads <= 1 or len(layers) < 2:
        return [solve(layer) for layer in layers]
    with ThreadPoolExecutor(min(threads, len(layers))) as pool:
        return list(pool.map(solve, layers))


def rotary_head_cost(pa: Params, pb: Params, layer: int) -> Tensor:
    """(H_A, H_B) factored distance between query heads of grouped rotary blocks, each with its group's
    keys and values, left after the best in-head maps for that pair: per frequency pair the rotary
    rotation-scaling on [W_q | b_q] against [W_k | b_k], and paper 002's rotation and rescaling on
    [W_v | b_v] against the head's output columns. Computed from cross moments (float64)."""
    pre = f"blocks.{layer}."

    def heads(p: Params) -> tuple[Tensor, ...]:
        aug = lambda n: torch.cat([p[pre + n + "_w"], p[pre + n + "_b"][..., None]], -1).double()  # noqa: E731
        q = aug("q")
        group = q.shape[1]
        per_head = lambda t: t.repeat_interleave(group, 0)  # noqa: E731  a group's rows for each query head
        o = p[pre + "o_w"].flatten(0, 1).transpose(1, 2).double()
        return as_complex(q.flatten(0, 1)), as_complex(per_head(aug("k"))), per_head(aug("v")), o

    za, ua, va, oa = heads(pa)
    zb, ub, vb, ob = heads(pb)
    moment = lambda x, y: torch.einsum("ifn,jfn->ijf", x, y.conj())  # noqa: E731
    cz, cu = moment(za, zb), moment(ua, ub)
    norms = lambda t: t.abs().pow(2).sum(-1)  # noqa: E731
    P, Q = norms(zb)[None].expand_as(cz.real), norms(ub)[None].expand_as(cz.real)
    w = solve_pairs(cz, cu, P, Q)
    qk = pair_distance(w, cz, cu, P, Q, norms(za)[:, None], norms(ua)[:, None]).sum(-1)
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


def group_assignment(cost: Tensor, groups: int) -> tuple[Permutation, Permutation]:
    """Key/value groups and, within each matched pair of groups, their query heads, from a (H, H) cost
    between query heads (H = groups * G, head k * G + g in group k): a pair of groups costs the best
    assignment of their query heads (Hungarian on G x G), and groups are assigned on those costs.
    Returns (heads: groups, qheads: one permutation per new group)."""
    size = cost.shape[0] // groups
    blocks = cost.reshape(groups, size, groups, size).permute(0, 2, 1, 3)  # (K_A, K_B, G, G)
    inner = [[Permutation.project(-blocks[i, j]).perm for j in range(groups)] for i in range(groups)]
    pair_cost = torch.tensor(
        [[float(blocks[i, j][torch.arange(size), inner[i][j]].sum()) for j in range(groups)] for i in range(groups)]
    )
    outer = Permutation.project(-pair_cost).perm
    return Permutation(outer), Permutation(torch.stack([inner[i][int(outer[i])] for i in range(groups)]))


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

    return cosine("gate") + cosine("in") * cosine("out")


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


def in_head_maps(pa: Params, pb: Params, layers: range) -> Transform:
    """For grouped rotary blocks interpolated as factored weights: per layer the qk rotation-scalings
    (per frequency pair) and vo rotations with rescaling (per group) moving B's heads onto A's."""
    from glmc.matching.rotation import closed_form_rotations, optimal_scales  # rotation imports this module

    out = Transform()
    for layer in layers:
        (xa, ya), (xb, yb) = (pair_factors(p, layer, "qk", GATED_GROUPED) for p in (pa, pb))
        out[f"qk.{layer}"] = rotary_scales(xa, ya, xb, yb).to(dtype=torch.float32)
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
) -> list[tuple[Tensor, Tensor]]:
    """Residual-side blocks outside the layers as (D, n) matrices, the residual axis first. `tokens`
    keeps only those rows of the token embedding and the unembedding (ids that occur in the training
    data: the rest of a 50,257-token vocabulary is untrained noise)."""
    blocks = []
    for name, (axis, vocab_rows) in residual_only.items():
        a, b = pa[name], pb[name]
        if tokens is not None and vocab_rows:
            a, b = a[tokens], b[tokens]
        blocks.append(tuple(t.movedim(axis, 0).reshape(t.shape[axis], -1) for t in (a, b)))
    return blocks


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
    False recomputes everything every iteration."""
    if residual not in ("orthogonal", "permutation", "none"):
        raise ValueError(f"residual={residual!r} is not one of orthogonal, permutation, none")
    if model_a.config.form != "factored" or model_b.config.form != "factored":
        raise ValueError("weight matching reads factored heads: pass models before .to_circuit()")
    spec = SymmetrySpec.from_model(model_b)
    pa = {k: v.detach().to(dtype) for k, v in model_a.params().items()}
    pb = {k: v.detach().to(dtype) for k, v in model_b.params().items()}
    # Embeddings and the classifier only see the residual map: their share of the Procrustes
    # matrix and of the objective is computed once (a GPT-2 vocabulary makes them the costliest part).
    residual_only = _residual_only(model_b)
    vectors = residual_vectors(model_b)
    emb = _embedding_blocks(pa, pb, residual_only, tokens)
    c_emb_raw, c_emb, emb_aa, emb_bb = 0.0, 0.0, 0.0, 0.0
    for a, b in emb:  # float64, each block converted once: the objective cancels
        a64, b64 = a.double(), b.double()
        product = a64 @ b64.T
        c_emb_raw, c_emb = c_emb_raw + product, c_emb + product / a.shape[1]
        emb_aa, emb_bb = emb_aa + _sum_of_squares(a64), emb_bb + _sum_of_squares(b64)
        del a64, b64, product
    # a task head's hidden state (BERT's masked-LM transform, pooler) has a permutation of its own
    hidden = HiddenHead(spec, pa, pb) if HEAD_HIDDEN in spec.spaces else None
    moving = residual_only.keys() | (hidden.axis.keys() if hidden is not None else set())
    fixed = [n for n in pa if layer_of(n) is None and n not in moving]  # head.b: no symmetry acts
    fixed_diff = sum(float((pa[n] - pb[n]).pow(2).sum()) for n in fixed)
    fixed_norm = sum(float(pa[n].pow(2).sum()) for n in fixed)
    pa = {k: v for k, v in pa.items() if layer_of(k) is not None}
    pb = {k: v for k, v in pb.items() if layer_of(k) is not None}
    spec_blocks = spec.restricted_to(set(pb))
    # families without a circuit form (grouped rotary heads) are matched on the factored distance itself
    family = family_named(model_b.config.family)
    factored = not family.circuit_form
    grouped = family.attention_kind == "grouped"
    layout = family.layout(model_b.config)

    layers = range(model_a.num_layers)
    perms = Transform()
    if heads:
        perms.update({f"heads.{l}": Permutation.identity(spec[f"heads.{l}"].size) for l in layers})
        if grouped:
            query_heads = [spec[f"qheads.{l}"] for l in layers]
            perms.update({q.name: Permutation.identity(q.size, q.heads) for q in query_heads})
    if mlp:
        perms.update({f"mlp.{l}": Permutation.identity(spec[f"mlp.{l}"].size) for l in layers})
        if f"mlp_scale.{layers[0]}" in spec.spaces:
            perms.update({f"mlp_scale.{l}": Diagonal.identity(spec[f"mlp_scale.{l}"].size) for l in layers})
    width = model_a.width
    basis = ones_complement(width) if keep_mean and residual == "orthogonal" else None
    res = {}
    if residual == "orthogonal":
        res = {"residual": Orthogonal(torch.eye(width, dtype=dtype))}
    elif residual == "permutation":
        res = {"residual": Permutation.identity(width)}

    def res_matrix(t: Transform) -> Tensor:
        g = t.get("residual")
        if g is None:
            return torch.eye(width, dtype=dtype)
        return g.dense(dtype) if isinstance(g, Permutation) else g.matrix.to(dtype)

    norm = (squared_plain_norm if factored else squared_norm)(pa)  # A's side does not move
    a_circuits = None if factored else a_circuit_terms(pa)

    def distance(pb_t: Params, t: Transform, mlp_d2: float | None = None) -> float:
        """Objective of transform t, given B's layer weights already transformed by it; with `mlp_d2`,
        the MLP matrices' share (left out of pb_t's comparison)."""
        compared = pa if mlp_d2 is None else pa_rest
        if factored:
            diff = squared_plain_difference(compared, pb_t)
        else:
            diff = squared_difference(compared, pb_t, a_circuits, b_norms)
        diff += emb_aa + emb_bb - 2 * float((res_matrix(t).double() * c_emb_raw).sum()) + fixed_diff
        if hidden is None:
            return (max(diff + (mlp_d2 or 0.0), 0.0) / (norm + emb_aa + fixed_norm)) ** 0.5
        diff += hidden.squared_difference(t.get("residual"), t[HEAD_HIDDEN])
        return (max(diff + (mlp_d2 or 0.0), 0.0) / (norm + emb_aa + fixed_norm + hidden.norm)) ** 0.5

    # The residual map is the only dense contraction: it is applied once per iteration, and the
    # permutations (index gathers) on top of it.
    seconds: dict[str, float] = defaultdict(float)
    gram_misses = 0  # the residual's polar factor from its Gram matrix, until that failed twice in a row
    linear_shares: dict[int, tuple[Tensor, dict[str, Tensor]]] = {}  # late: per layer, (MLP permutation, parts)

    def linear_share(pb_perm: Params, layer: int) -> Tensor:
        """Late path: a layer's linear_cross_covariance, recomputed only when its MLP permutation moved
        (pb_perm leaves B's MLP matrices as they are: this layer's are permuted here)."""
        perm = perms[f"mlp.{layer}"].perm
        kept = linear_shares.get(layer)
        if kept is None or not torch.equal(kept[0], perm):
            moved = Transform({f"mlp.{layer}": perms[f"mlp.{layer}"]})
            rows = {**pb_perm, **apply_params(moved, spec_mlp[layer], {n: pb[n] for n in mlp_matrices(layer)})}
            kept = linear_shares[layer] = (perm.clone(), linear_parts(pa, rows, layer, vectors))
        return sum(kept[1].values())

    gated = f"mlp_scale.{layers[0]}" in perms
    # MLP cosines move by at most the residual map's move: their assignments carry over (not for the
    # gated MLPs' cost, nor without a residual map to measure the move by); below PARALLEL_UNITS
    # units the solver is as cheap as the certificates
    big = mlp and spec[f"mlp.{layers[0]}"].size >= PARALLEL_UNITS
    warm = WarmAssignments() if reuse and big and not gated and residual != "none" else None
    # head costs move by at most circuit_move: theirs carry over too (not in grouped rotary models)
    head_warm = WarmAssignments() if reuse and heads and not grouped and residual != "none" else None
    head_norms = [float(circuit_norms(pb, l).max()) for l in layers] if head_warm is not None else []
    # While MLP assignments carry over, B's MLP matrices are rotated only for the layers whose
    # similarity is computed, and their distance is expanded in the map's move (MlpDistance); the
    # residual step keeps its linear shares and takes the polar factor from the Gram matrix. Smaller
    # models keep the earlier arithmetic (the same floats, so learned matching, which starts from
    # them, retraces its runs), where these would save little.
    late = warm is not None and not factored
    mlp_names = {n for l in layers for n in mlp_matrices(l)} if late else set()
    spec_rest = spec_blocks.restricted_to(set(pb) - mlp_names) if late else spec_blocks
    spec_mlp = {l: spec_blocks.restricted_to(set(mlp_matrices(l))) for l in layers} if late else {}
    pa_rest = {k: v for k, v in pa.items() if k not in mlp_names}
    b_norms = circuit_square_norms(pb) if late else None  # late: B's circuit norms stay as they are
    mlp_distance = MlpDistance(pa, pb)

    def rotated_similarity(pb_res: Params, rotated: dict[int, Params], layer: int) -> Tensor:
        """mlp_similarity at the current map, rotating the layer's MLP matrices (kept in `rotated`)."""
        rotated[layer] = apply_params(Transform(res), spec_mlp[layer], {n: pb[n] for n in mlp_matrices(layer)})
        return mlp_similarity(pa, {**pb_res, **rotated[layer]}, layer)

    def mlp_share(rotated: dict[int, Params]) -> float:
        """The MLP matrices' squared distance at the current map and permutations."""
        r, d2, crosses = res_matrix(Transform(res)), 0.0, {}
        for l in layers:
            if l in rotated:
                moved = Transform({f"mlp.{l}": perms[f"mlp.{l}"]})
                d2 += mlp_distance.direct(l, r, apply_params(moved, spec_mlp[l], rotated[l]))
            else:  # unchanged permutation: its cross-covariances are the residual step's
                parts = linear_shares[l][1]
                reader, writer = mlp_matrices(l)
                crosses[l] = parts["in_w"] * pa[reader].shape[0] + parts["out_w"] * pa[writer].shape[1]
        return d2 + (mlp_distance.expanded_total(r, crosses) if crosses else 0.0)

    head = {} if hidden is None else {HEAD_HIDDEN: Permutation.identity(hidden.size)}
    best_t = Transform({**res, **perms, **head})
    # the search starts at the identity, which leaves every weight as it is (exactly: products with
    # ones and zeros): B's own weights, not a product over all of them
    pb_cur = dict(pb)
    best = distance(pb_cur, best_t)
    objective = [best]
    per_iteration: list[float] = []
    for it in range(max_iter):
        started = time.perf_counter()
        if residual != "none":
            tick = time.perf_counter()
            c = c_emb_raw if factored else c_emb
            if it > 0:  # the first iteration sees only the embeddings and the classifier
                pb_perm = apply_params(perms, spec_rest, pb)  # late: B's MLP matrices as they are
                if factored:
                    c = c + factored_cross_covariance(pa, pb_perm, layout, width)
                else:
                    linear = partial(linear_share, pb_perm) if late else None
                    c = c + block_cross_covariance(pa, pb_perm, pb_cur, vectors, linear)
                del pb_perm
                if hidden is not None:  # the head's first map, its rows in the hidden order found so far
                    c = c + hidden.residual_cross(head[HEAD_HIDDEN], width, raw=factored)
            # the polar factor in float64: its error grows with the conditioning of c
            if residual == "permutation":
                res = {"residual": Permutation.project(c)}
            elif basis is not None:
                res = {"residual": Orthogonal(mean_keeping_projection(c, basis).to(dtype))}
            else:
                matrix, served = polar_factor(c.double(), late and gram_misses < 2)
                gram_misses = 0 if served else gram_misses + 1
                res = {"residual": Orthogonal(matrix.to(dtype))}
            seconds["residual"] += time.perf_counter() - tick
        tick = time.perf_counter()
        pb_res = apply_params(Transform(res), spec_rest, pb)  # late: B's MLP matrices as they are
        rotated: dict[int, Params] = {}  # late: the layers whose MLP matrices were rotated
        seconds["apply"] += time.perf_counter() - tick
        # the layers' assignment problems are independent: their Hungarian solves run side by side
        if heads:
            tick = time.perf_counter()
            if grouped:
                for l in layers:
                    cost = rotary_head_cost(pa, pb_res, l) if factored else circuit_cost(pa, pb_res, l)
                    perms[f"heads.{l}"], perms[f"qheads.{l}"] = group_assignment(cost, spec[f"heads.{l}"].size)
            elif head_warm is not None:
                r = res_matrix(Transform(res))
                similarity = partial(head_similarity, pa, pb_res)
                for l in layers:
                    within = partial(circuit_move, head_norms[l])
                    perms[f"heads.{l}"] = head_warm.solve(r, similarity, l, within)
            else:
                solved = assign_layers(partial(projected, partial(head_similarity, pa, pb_res)), layers, 1)
                perms.update(zip((f"heads.{l}" for l in layers), solved))
            seconds["heads"] += time.perf_counter() - tick
        if mlp:
            tick = time.perf_counter()
            similarity = partial(gated_mlp_similarity if gated else mlp_similarity, pa, pb_res)
            if late:
                similarity = partial(rotated_similarity, pb_res, rotated)
            # a pool pays for itself from about a thousand units (a GPT-2's MLP), not on small models
            pool = threads if spec[f"mlp.{layers[0]}"].size >= PARALLEL_UNITS else 1
            if warm is None:
                solved = assign_layers(partial(projected, similarity), layers, pool)
            else:  # the layers still inside their certified radius first: no threads for those
                r = res_matrix(Transform(res))  # what the similarities depend on
                kept = {l: warm.kept(r, l) for l in layers}
                rest = [l for l in layers if kept[l] is None]
                fresh = dict(zip(rest, assign_layers(partial(warm.solve, r, similarity), rest, pool)))
                solved = [fresh[l] if kept[l] is None else kept[l] for l in layers]
            perms.update(zip((f"mlp.{l}" for l in layers), solved))
            if gated:
                moved = apply_params(Transform({f"mlp.{l}": perms[f"mlp.{l}"] for l in layers}), spec_blocks, pb_res)
                perms.update({f"mlp_scale.{l}": unit_scales(pa, moved, l) for l in layers})
                del moved
            seconds["mlp"] += time.perf_counter() - tick
        if factored:  # the in-head maps of the groups just matched decide which factored weights compare
            tick = time.perf_counter()
            moved = apply_params(
                Transform({k: g for k, g in perms.items() if k.startswith(("heads.", "qheads."))}), spec_blocks, pb_res
            )
            perms.update(in_head_maps(pa, moved, layers))
            del moved
            seconds["in_head"] += time.perf_counter() - tick
        if hidden is not None:
            head = {HEAD_HIDDEN: hidden.solve(res.get("residual"))}
        current = Transform({**res, **perms, **head})
        tick = time.perf_counter()
        del pb_cur  # B's weights are held at most twice more at a time (1B-parameter models)
        pb_cur = apply_params(perms, spec_rest, pb_res)
        del pb_res
        value = distance(pb_cur, current, mlp_share(rotated) if late else None)
        del rotated
        seconds["objective"] += time.perf_counter() - tick
        objective.append(value)
        per_iteration.append(time.perf_counter() - started)
        improved = best - value
        if value < best:
            best, best_t = value, Transform(current)
        # the first iteration saw only the embeddings: always let the full objective run once
        if it > 0 and improved <= tol * max(best, 1e-12):
            break
    best_t = best_t.to(dtype=torch.float32)
    diagnostics: dict[str, Any] = {
        "objective": objective,
        "iterations": len(objective) - 1,
        "seconds_by_step": dict(seconds),
        "seconds_by_iteration": per_iteration,
        "final_distance": best,
    }
    # how many layer-iterations of MLP and head assignment were skipped, certified, solved
    if warm is not None:
        diagnostics["mlp_assignments"] = dict(warm.counts)
    if head_warm is not None:
        diagnostics["head_assignments"] = dict(head_warm.counts)
    if isinstance(best_t.get("residual"), Orthogonal):  # paper 001 Fig. 5: how far from the identity
        diagnostics["residual_angles"] = eigen_angles(best_t["residual"].matrix)
    return best_t, diagnostics


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
        residual: str = "orthogonal",
        heads: str = "permutation",
        mlp: str = "permutation",
        qk: str = "circuit",
        vo: str = "circuit",
        max_iter: int = 15,
        tol: float = 1e-6,
        vocabulary: str = "train",
        keep_mean: str = "never",
    ):
        if max_iter < 1:
            raise ValueError(f"matcher.{name}.max_iter={max_iter}: at least one iteration")
        if vocabulary not in ("train", "all"):
            raise ValueError(f"matcher.{name}.vocabulary={vocabulary!r} is not one of train, all")
        if keep_mean not in ("auto", "always", "never"):
            raise ValueError(f"matcher.{name}.keep_mean={keep_mean!r} is not one of auto, always, never")
        self.keep_mean = keep_mean
        self.name, self.residual, self.heads, self.mlp = name, residual, heads != "none", mlp != "none"
        self.circuits, self.max_iter, self.tol, self.vocabulary = circuit_pairs(qk, vo), max_iter, tol, vocabulary

    def match(self, a: CanonicalTransformer, b: CanonicalTransformer, context: MatchContext | None = None) -> Alignment:
        require_factored(self.name, a, b)
        tokens = used_tokens(b, context) if self.vocabulary == "train" else None
        keep_mean = self.resolve_keep_mean(a, b)
        transform, diagnostics = weight_matching(
            a, b, self.residual, self.heads, self.mlp, self.max_iter, self.tol, tokens=tokens, keep_mean=keep_mean
        )
        diagnostics["keep_mean"] = keep_mean
        if tokens is not None:
            diagnostics["vocabulary_rows"] = int(tokens.numel())
        return Alignment(
            reference=a, model=apply(transform, b), transform=transform, circuits=self.circuits, diagnostics=diagnostics
        )

    def resolve_keep_mean(self, a: CanonicalTransformer, b: CanonicalTransformer) -> bool:
        """Whether the orthogonal residual map is restricted to fix the all-ones vector."""
        if self.keep_mean == "never" or self.residual != "orthogonal":
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
