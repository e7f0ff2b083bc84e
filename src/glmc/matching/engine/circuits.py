"""Paper 001's comparison in circuit form, computed from factored heads without building any D x D
circuit: the head cost ||QK_A,i - QK_B,j||_F + ||OV_A,i - OV_B,j||_F and the distance between two
models; for families without a circuit form, the distance over the tensors as they are."""

from __future__ import annotations

import torch
from torch import Tensor

from glmc.models.blocks import full
from glmc.models.families.roles import in_head_pair, layer_of, pair_factors

Params = dict[str, Tensor]


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
    return pair_factors(p, layer, "qk", full.ROLES), pair_factors(p, layer, "vo", full.ROLES)


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
    """How far a head cost can move when the residual map moves by at most `moved` in spectral norm:
    R C R^T moves by at most (2 + d) d ||C||; `norm` is the largest circuit_norms entry."""
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
    """||theta_A - theta_B||^2 over circuit-form parameters, heads compared in place; `a_circuits`
    (a_circuit_terms) and `b_norms` (circuit_square_norms) where the caller keeps them."""
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


def relative_distance(pa: Params, pb: Params) -> float:
    """||theta_A - theta_B|| / ||theta_A|| over the circuit-form parameters."""
    return (squared_difference(pa, pb) / squared_norm(pa)) ** 0.5


def squared_plain_norm(pa: Params) -> float:
    """||theta_A||^2 over the tensors as they are."""
    return sum(float(a.double().pow(2).sum()) for a in pa.values())


def squared_plain_difference(pa: Params, pb: Params, total: float = 0.0) -> float:
    """||theta_A - theta_B||^2 over the tensors as they are, added to `total` one tensor at a time in pa's
    order (a caller adding layer by layer gets the same float)."""
    for n, a in pa.items():
        total += float((a.double() - pb[n].double()).pow(2).sum())
    return total
