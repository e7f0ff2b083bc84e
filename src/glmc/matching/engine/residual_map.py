"""The residual step's inputs: the cross-covariance of A's and B's residual-side weights (the tensors
outside the layers computed once, the layers' share per iteration), the projection that keeps the
all-ones vector fixed, and the angles of the map found."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from glmc.matching.engine.head_hidden import HiddenHead
from glmc.matching.engine.projections import decomposing
from glmc.models.canonical import CanonicalTransformer
from glmc.models.families import family_named
from glmc.models.families.base import residual_axis
from glmc.models.families.roles import layer_of
from glmc.symmetry import Orthogonal

Params = dict[str, Tensor]


def _aug(p: Params, pre: str, n: str) -> Tensor:
    """[W | b] per head: (H, d, D+1)."""
    return torch.cat([p[pre + n + "_w"], p[pre + n + "_b"][..., None]], -1)


def residual_only_tensors(model: CanonicalTransformer) -> dict[str, tuple[int, bool]]:
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
    """Residual-side blocks outside the layers as (D, n) matrices, the residual axis first; `tokens`: the
    vocabulary rows kept (the untrained rest is noise)."""
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

    pb_perm: B with the head and MLP permutations; pb_full: also with the current residual map (the
    circuits' other side). The embedding blocks are the caller's. `linear`: a layer's kept
    linear_cross_covariance (None: computed here, term by term)."""
    c = 0.0
    for layer in sorted({int(n.split(".")[1]) for n in pa if n.startswith("blocks.")}):
        c = linear_cross_covariance(pa, pb_perm, layer, vectors, c) if linear is None else c + linear(layer)
        c = circuit_cross_covariance(pa, pb_perm, pb_full, layer, c)
    return c


def factored_cross_covariance(pa: Params, pb: Params, layout: dict, width: int, names=None) -> Tensor:
    """C = sum_t A_t B_t^T over the tensors with a residual axis (those in `names` where given), that axis
    first and the rest flattened: <O, C> is the factored inner product of A with B's tensors mapped by O
    (float64)."""
    c = torch.zeros(width, width, dtype=torch.float64, device=next(iter(pa.values())).device)
    for name, a in pa.items():
        if names is not None and name not in names:
            continue
        axis = residual_axis(layout, name, "out")
        axis = residual_axis(layout, name, "in") if axis is None else axis
        if axis is None:
            continue
        b = pb[name]
        c += a.movedim(axis, 0).reshape(width, -1).double() @ b.movedim(axis, 0).reshape(width, -1).double().T
    return c


def ones_complement(width: int, device: torch.device | str | None = None) -> Tensor:
    """Orthonormal basis (width, width - 1) of the hyperplane orthogonal to the all-ones vector, float64."""
    m = torch.eye(width, dtype=torch.float64, device=device)
    m[:, 0] = 1.0  # columns 1, e_1, ..., e_{D-1}: QR's first column spans 1, the others its complement
    return torch.linalg.qr(m).Q[:, 1:]


def mean_keeping_projection(c: Tensor, basis: Tensor) -> Tensor:
    """argmax <O, c> over orthogonal O with O 1 = 1, in float64: Q polar(Q^T c Q) Q^T + 1 1^T / D,
    with Q = `basis` (from ones_complement)."""
    width = basis.shape[0]
    inner = Orthogonal.project(basis.T @ c.double() @ basis).matrix
    return basis @ inner @ basis.T + torch.full((width, width), 1.0 / width, dtype=torch.float64, device=basis.device)


@dataclass
class Outside:
    """The tensors outside the layers, computed once in float64: their share of the cross-covariance
    (`c_raw` as is, `c` per column), their squared norms, and the distance and norm of head.b."""

    c_raw: Tensor | float
    c: Tensor | float
    aa: float
    bb: float
    fixed_diff: float
    fixed_norm: float


# columns of an embedding table converted to float64 at a time (tables up to this wide in one product)
OUTSIDE_COLUMNS = 8192


def outside_terms(
    pa: Params, pb: Params, residual_only: dict[str, tuple[int, bool]], hidden: HiddenHead | None, tokens: Tensor | None
) -> Outside:
    """Outside's terms from every tensor of A and B (`residual_only`: residual_only_tensors; `hidden`: the head's
    hidden state, whose tensors HiddenHead compares)."""
    c_raw, c, aa, bb = 0.0, 0.0, 0.0, 0.0
    for a, b in _embedding_blocks(pa, pb, residual_only, tokens):  # float64, each block converted once
        product = torch.zeros(a.shape[0], b.shape[0], dtype=torch.float64, device=a.device)
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


def eigen_angles(matrix: Tensor) -> list[float]:
    """The angles |arg z| in [0, pi] of an orthogonal matrix's eigenvalues z, ascending, from the singular
    values |z - 1| = 2 sin(t / 2) of the normal matrix Q - I (cheaper than general eigenvalues)."""
    q = matrix.detach().cpu().double()
    with decomposing(q):
        sines = torch.linalg.svdvals(q - torch.eye(len(q), dtype=q.dtype)).mul(0.5).clamp(max=1.0)
    return sorted(float(a) for a in 2 * torch.asin(sines))
