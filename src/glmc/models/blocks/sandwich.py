"""Sandwich norms: an RMS norm with a learned gain on each sublayer's output before it joins the stream.

Gemma 2 and 3 have them besides the pre-norms, OLMo-2 instead of them (its family reads the raw stream:
Family.pre_norms). attn_post and mlp_post (D) hold the gains of the norms after attention (its output
with o_b) and after the MLP; the norm divides by the RMS over config.norm_dim, as the pre-norms do.

What keeps the function. A residual map R acts on the writers before the norm (o_w, o_b, out_w, out_b)
and on the stream the norm's output joins, so it must satisfy g' * norm(R y) = R (g * norm(y)) for every
branch output y. The RMS norm commutes with R only where R is orthogonal; then diag(g') R = R diag(g) for
a generic gain g (distinct entries of any sign) forces R to map each coordinate to one coordinate: a
signed permutation, with g' the gain permuted the same way. Sign flips keep the gain as it is (a diagonal
sign commutes with diag(g)), permutations carry it along; a general rotation mixes coordinates of
different gains and changes the function. So the block admits the residual signed permutations (and
permutations, their subgroup), and its gains are gains of the residual space (Acts.gain): moved with it,
never flipped.
"""

from __future__ import annotations

import torch
from torch import Tensor

from glmc.models.blocks.registry import BlockKind
from glmc.models.families.roles import Acts, block_role

ROLES = (
    block_role("attn_post", "attn", Acts("residual", 0, "out", gain=True)),
    block_role("mlp_post", "mlp", Acts("residual", 0, "out", gain=True)),
)


def output(config, p: dict[str, Tensor], pre: str, sublayer: str, y: Tensor) -> Tensor:
    """The branch output y (B, T, D) of sublayer "attn" or "mlp", normalised and scaled by its gain."""
    normed = y * torch.rsqrt(y.pow(2).sum(-1, keepdim=True) / config.norm_dim + config.norm_eps)
    return normed * p[pre + sublayer + "_post"]


KIND = BlockKind("sandwich", "branch", output, ROLES, residual_classes=frozenset({"signed_permutation", "permutation"}))
