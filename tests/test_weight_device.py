"""matcher.weight.device: weight matching runs where it is told (auto: where the models are) and finds
the same alignment there; the device's assignment solver, where it is used, finds the host's optimum."""

from __future__ import annotations

from dataclasses import fields

import pytest
import torch

import glmc
from glmc.matching.base import MatchContext
from glmc.matching.engine import device_assignment
from glmc.matching.engine.warm_assignment import fresh_assignment
from glmc.matching.weight import WeightMatcher, search_device, weight_matching
from glmc.models import to_canonical

from tiny_hf import tiny_gpt2, tiny_llama

PAIRS = {"gpt2": lambda seed: tiny_gpt2(seed), "llama": lambda seed: tiny_llama(seed)}


def _pair(family: str):
    return to_canonical(PAIRS[family](0)), to_canonical(PAIRS[family](1))


def _assert_same(t1, t2) -> None:
    assert t1.keys() == t2.keys()
    for name in t1:
        for field in fields(t1[name]):
            x, y = getattr(t1[name], field.name), getattr(t2[name], field.name)
            assert x.device == y.device and torch.equal(x, y), f"{name}.{field.name} differs"


@pytest.mark.parametrize("family", PAIRS)
def test_explicit_cpu_gives_the_default_alignment(family):
    a, b = _pair(family)
    default = WeightMatcher(max_iter=3).match(a, b)
    explicit = WeightMatcher(max_iter=3, device="cpu").match(a, b)
    _assert_same(default.transform, explicit.transform)
    assert default.diagnostics["objective"] == explicit.diagnostics["objective"]
    assert explicit.diagnostics["device"] == "cpu"


def _route_to_device_solver(monkeypatch) -> None:
    """CPU tensors through the device solver's branch (the auction), as CUDA tensors would go."""
    monkeypatch.setattr(device_assignment, "DEVICE_SOLVER_TYPES", ("cuda", "cpu"))
    monkeypatch.setattr(device_assignment, "DEVICE_UNITS", 2)


@pytest.mark.parametrize("family", PAIRS)
def test_device_solver_branch_gives_the_host_alignment(family, monkeypatch):
    a, b = _pair(family)
    host, host_diag = weight_matching(a, b, max_iter=3)
    _route_to_device_solver(monkeypatch)
    routed, routed_diag = weight_matching(a, b, max_iter=3, device="cpu")
    _assert_same(host, routed)
    assert host_diag["objective"] == routed_diag["objective"]


def test_fresh_assignment_on_the_device_solver_is_the_host_optimum(monkeypatch):
    s = torch.randn(96, 96, generator=torch.Generator().manual_seed(0))
    host, _, _ = fresh_assignment(s)
    _route_to_device_solver(monkeypatch)
    routed, _, _ = fresh_assignment(s)
    assert device_assignment.solves_on_device(s) and torch.equal(host.perm, routed.perm)


def test_cuda_refused_by_name_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    a, b = _pair("gpt2")
    with pytest.raises(ValueError, match=r"matcher\.weight\.device=cuda .*use matcher\.weight\.device=auto or cpu"):
        WeightMatcher(device="cuda").match(a, b)
    with pytest.raises(ValueError, match="device"):
        WeightMatcher(device="gpu")


def test_auto_is_where_the_models_are_or_the_runs_cuda_device():
    a, _ = _pair("gpt2")
    assert search_device("auto", a, None) == torch.device("cpu")
    assert search_device("auto", a, MatchContext()) == torch.device("cpu")
    # models on the host, a run on a GPU (trainer=gpu): the search goes to the run's device
    assert search_device("auto", a, MatchContext(device=torch.device("cuda", 0))) == torch.device("cuda", 0)
    assert search_device("cpu", a, MatchContext(device=torch.device("cuda", 0))) == torch.device("cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("family", PAIRS)
def test_cuda_search_finds_the_host_alignment(family):
    hf_a, hf_b = PAIRS[family](0), PAIRS[family](1)
    host = glmc.align(hf_a, hf_b, "weight", max_iter=3)
    on_card = glmc.align(hf_a.cuda(), hf_b.cuda(), "weight", max_iter=3)  # auto: the models' device
    assert on_card.diagnostics["device"].startswith("cuda")
    layerwise, _ = weight_matching(*_pair(family), max_iter=3, device="cuda", layerwise=True)
    for found in (on_card.transform, layerwise):
        assert found.keys() == host.transform.keys()
        for name, g in host.transform.items():
            for field in fields(g):
                x, y = getattr(g, field.name), getattr(found[name], field.name).cpu()
                if x.is_floating_point():
                    torch.testing.assert_close(y, x, atol=1e-5, rtol=1e-5)
                else:
                    assert torch.equal(x, y), f"{name}: a different assignment on the card"
