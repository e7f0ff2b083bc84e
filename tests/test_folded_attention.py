"""Attention folded under vmap (glmc.train.folded_attention): each member's output and gradients are
bit for bit those of its own SDPA call, for every mask SDPA takes, and one kernel call serves them all."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from glmc.train.folded_attention import FoldedAttention

pytestmark = pytest.mark.numeric  # attention computed two ways, compared bit for bit

MEMBERS, BATCH, HEADS, TOKENS, FEATURES = 3, 2, 4, 5, 8


def _attend(q, k, v, mask=None, causal=False):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)


@pytest.mark.parametrize("mask", ["none", "causal", "float", "bool", "one_row", "per_member"])
def test_a_folded_call_is_each_members_own_call_bit_for_bit(mask):
    g = torch.Generator().manual_seed(0)
    shape = (MEMBERS, BATCH, HEADS, TOKENS, FEATURES)
    q, k, v = (torch.randn(shape, generator=g, requires_grad=True) for _ in range(3))
    scores = torch.randn(MEMBERS, BATCH, 1, TOKENS, TOKENS, generator=g)
    masks = {"none": None, "causal": None, "float": scores[0], "bool": scores[0] > 0, "one_row": scores[0, :1]}
    causal = mask == "causal"
    if mask == "per_member":
        alone = torch.stack([_attend(q[m], k[m], v[m], scores[m]) for m in range(MEMBERS)])
        with FoldedAttention():
            folded = torch.vmap(_attend)(q, k, v, scores)
    else:
        alone = torch.stack([_attend(q[m], k[m], v[m], masks[mask], causal) for m in range(MEMBERS)])
        with FoldedAttention():
            folded = torch.vmap(lambda a, b, c: _attend(a, b, c, masks[mask], causal))(q, k, v)
    assert torch.equal(folded, alone)
    grads_alone = torch.autograd.grad(alone.square().sum(), (q, k, v))
    grads_folded = torch.autograd.grad(folded.square().sum(), (q, k, v))
    assert all(torch.equal(a, b) for a, b in zip(grads_folded, grads_alone))


def test_the_members_share_one_kernel_call():
    q = torch.randn(MEMBERS, BATCH, HEADS, TOKENS, FEATURES)
    with torch.profiler.profile() as prof, FoldedAttention():
        torch.vmap(_attend)(q, q, q)
    calls = [e.count for e in prof.key_averages() if e.key == "aten::_scaled_dot_product_flash_attention_for_cpu"]
    assert calls == [1]
