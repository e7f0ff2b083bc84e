"""Grouped expert products folded under vmap (glmc.train.folded_experts): each member's output and
gradients are bit for bit those of its own grouped call, with the weights as stored or transposed as the
experts pass them and with an expert that gets no rows, and one kernel call serves the members' forward (in
an ensemble of Mixtrals, as many calls as one model makes)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from glmc.models.build import build_model
from glmc.train.ensemble import EnsembleModule
from glmc.train.folded_experts import FoldedExperts

from conftest import compose_config

pytestmark = pytest.mark.numeric  # expert products computed two ways, compared bit for bit

MEMBERS, ROWS, EXPERTS, IN, OUT = 3, 11, 4, 8, 12  # features a multiple of 4: the kernel wants 16-byte strides


def _ends(g: torch.Generator) -> torch.Tensor:
    """Each member's group ends (int32, the last at ROWS), expert 1 without rows for member 0."""
    ends = []
    for m in range(MEMBERS):
        cuts = torch.sort(torch.randint(0, ROWS + 1, (EXPERTS - 1,), generator=g)).values
        if m == 0:
            cuts[1] = cuts[0]
        ends.append(torch.cat([cuts, torch.tensor([ROWS])]))
    return torch.stack(ends).to(torch.int32)


def _experts(rows, weight, ends):
    return F.gelu(F.grouped_mm(rows, weight.transpose(-2, -1), offs=ends))  # (experts, out, in) as stored


@pytest.mark.parametrize("layout", ["stored", "transposed"])
def test_a_folded_call_is_each_members_own_call_bit_for_bit(layout):
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(MEMBERS, ROWS, IN, generator=g, requires_grad=True)
    weight = torch.randn(MEMBERS, EXPERTS, OUT, IN, generator=g, requires_grad=True)
    ends = _ends(g)
    call = _experts if layout == "stored" else lambda r, w, e: torch._grouped_mm(r, w.transpose(-2, -1), offs=e)
    alone = torch.stack([call(rows[m], weight[m], ends[m]) for m in range(MEMBERS)])
    with FoldedExperts():
        folded = torch.vmap(call)(rows, weight, ends)
    assert torch.equal(folded, alone)
    grads_alone = torch.autograd.grad(alone.square().sum(), (rows, weight))
    grads_folded = torch.autograd.grad(folded.square().sum(), (rows, weight))
    assert all(torch.equal(a, b) for a, b in zip(grads_folded, grads_alone))


def test_the_members_share_one_kernel_call():
    g = torch.Generator().manual_seed(1)
    rows, weight = torch.randn(MEMBERS, ROWS, IN, generator=g), torch.randn(MEMBERS, EXPERTS, OUT, IN, generator=g)
    ends = _ends(g)
    with torch.profiler.profile() as prof, FoldedExperts():
        torch.vmap(_experts)(rows, weight, ends)
    assert [e.count for e in prof.key_averages() if e.key == "aten::_grouped_mm"] == [1]


def test_other_grouped_products_pass_through():
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(EXPERTS, ROWS, IN, generator=g), torch.randn(EXPERTS, IN, OUT, generator=g)
    with FoldedExperts():
        assert torch.equal(F.grouped_mm(a, b), torch.bmm(a, b))  # 3-D x 3-D: no offsets, not an experts' call


def test_an_ensemble_of_mixtrals_calls_the_experts_kernel_as_one_model_does():

    cfg = compose_config("debug=fast", "model=mixtral_text", "data=pydoc")
    torch.manual_seed(0)
    models = [build_model(cfg.model) for _ in range(MEMBERS)]
    with torch.device("meta"):
        base = build_model(cfg.model)
    ensemble = EnsembleModule(models, base, cfg.train, cfg.data.task)
    tokens = torch.randint(0, cfg.model.vocab_size, (MEMBERS, 2, 16))

    def kernel_calls(run) -> int:
        with torch.profiler.profile() as prof:
            run()
        return sum(e.count for e in prof.key_averages() if e.key == "aten::_grouped_mm")

    alone = kernel_calls(lambda: models[0](tokens[0]).logits.sum().backward())
    assert alone > 0
    assert kernel_calls(lambda: ensemble(tokens).sum().backward()) == alone  # not once per member
