"""Linear layers folded under vmap (glmc.train.folded_linear): each member's output and gradients are those
of its own F.linear call (within the round-off of one product's sums, the same sums in the same order on
most BLAS builds), with and without a bias, for a stacked or a shared weight; and the backward writes the
stacked weights' gradients in their own layout, where vmap's own rule copies every one of them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from glmc.train.folded_linear import FoldedLinear

pytestmark = pytest.mark.numeric  # products computed two ways, compared

MEMBERS, BATCH, TOKENS, IN, OUT = 3, 4, 5, 24, 16


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    # a product's round-off grows with its length; relative to the magnitudes compared
    scale = expected.abs().max().item()
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5 * scale * IN**0.5)


def _members(shared_weight: bool, bias: bool, rows: tuple[int, ...]):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(MEMBERS, *rows, IN, generator=g, requires_grad=True)
    w = torch.randn(*(() if shared_weight else (MEMBERS,)), OUT, IN, generator=g, requires_grad=True)
    b = torch.randn(MEMBERS, OUT, generator=g, requires_grad=True) if bias else None
    return x, w, b


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shared_weight", [False, True])
@pytest.mark.parametrize("rows", [(BATCH, TOKENS), (BATCH,), ()])
def test_a_folded_linear_is_each_members_own_call(bias, shared_weight, rows):
    x, w, b = _members(shared_weight, bias, rows)
    alone = torch.stack([F.linear(x[m], w if shared_weight else w[m], b[m] if bias else None) for m in range(MEMBERS)])
    w_dim = None if shared_weight else 0
    with FoldedLinear():
        if bias:
            folded = torch.vmap(F.linear, in_dims=(0, w_dim, 0))(x, w, b)
        else:
            folded = torch.vmap(lambda x, w: F.linear(x, w), in_dims=(0, w_dim))(x, w)
    _close(folded, alone)
    inputs = (x, w, b) if bias else (x, w)
    g = torch.Generator().manual_seed(1)
    grad_out = torch.randn(alone.shape, generator=g)
    for a, f in zip(torch.autograd.grad(alone, inputs, grad_out), torch.autograd.grad(folded, inputs, grad_out)):
        _close(f, a)


def _backward_copies(folded: bool) -> int:
    x, w, b = _members(False, True, (BATCH, TOKENS))
    with FoldedLinear() if folded else torch.enable_grad():
        out = torch.vmap(F.linear)(x, w, b)
    grad_out = torch.ones(out.shape)
    with torch.profiler.profile() as prof:
        out.backward(grad_out)
    assert w.grad.is_contiguous()
    return sum(e.count for e in prof.key_averages() if e.key == "aten::copy_")


def test_the_backward_writes_the_weights_gradient_in_its_layout():
    assert _backward_copies(folded=False) > 0  # vmap's own rule: the transposed gradient copied over
    assert _backward_copies(folded=True) == 0


def test_other_calls_pass_through():
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(BATCH, IN, generator=g), torch.randn(OUT, IN, generator=g)
    with FoldedLinear():
        assert torch.equal(F.linear(x, w), x @ w.T)  # outside vmap: the plain call
        assert torch.equal(torch.add(x, 1), x + 1)
