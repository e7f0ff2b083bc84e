"""The assignment solver on the device (glmc.matching.engine.device_assignment): its answers reach SciPy's
optimum on random, batched, tied and ε-close problems, a failed certificate hands the problem to SciPy
and says so, warm starts give the same answers in fewer bidding rounds, and learned matching gives the
same hard permutations with it as with the host solver."""

from __future__ import annotations

import pytest
import torch
from scipy.optimize import linear_sum_assignment

import glmc.matching.engine.device_assignment as device_assignment
from glmc.matching.engine.device_assignment import DeviceAssignments, auction_assignment
from glmc.matching.learned_module import LearnedMatchingModule, LearnedSettings
from glmc.models import to_canonical
from glmc.symmetry import SymmetrySpec

from tiny_hf import tiny_vit


def scipy_optimum(s: torch.Tensor) -> tuple[float, torch.Tensor]:
    """SciPy's optimal value (float64) and assignment of one (n, n) problem."""
    s = s.detach().cpu().double()
    rows, cols = linear_sum_assignment(s.numpy(), maximize=True)
    return float(s[rows, cols].sum()), torch.as_tensor(cols)


def value(s: torch.Tensor, perm: torch.Tensor) -> float:
    s = s.detach().cpu().double()
    return float(s[torch.arange(len(perm)), perm.cpu()].sum())


def assert_optimal(s: torch.Tensor, perm: torch.Tensor, unique: bool = False) -> None:
    """perm is a permutation worth SciPy's optimum of every problem in the batch (and SciPy's own
    assignment where the optimum is unique)."""
    n = s.shape[-1]
    problems, perms = s.reshape(-1, n, n), perm.reshape(-1, n)
    for k, (problem, p) in enumerate(zip(problems, perms)):
        assert torch.equal(p.sort().values.cpu(), torch.arange(n)), f"problem {k}: not a permutation"
        best, cols = scipy_optimum(problem)
        assert value(problem, p) == pytest.approx(best, rel=1e-12, abs=1e-12), f"problem {k}"
        if unique:
            assert torch.equal(p.cpu(), cols), f"problem {k}"


@pytest.mark.parametrize("n,seed", [(2, 0), (3, 1), (8, 2), (64, 3), (128, 4)])
def test_random_problems_reach_scipys_optimum(n, seed):
    s = torch.rand(n, n, generator=torch.Generator().manual_seed(seed))
    found = auction_assignment(s)
    assert found.perm.shape == (n,) and found.perm.dtype == torch.long
    assert found.prices.shape == (n,) and found.prices.dtype == torch.float64
    assert found.fallback == ()
    assert_optimal(s, found.perm, unique=True)


def test_batched_problems_are_each_optimal():
    g = torch.Generator().manual_seed(0)
    heads = torch.randn(24, 32, 32, generator=g)  # the many small problems of one latent kind
    found = auction_assignment(heads)
    assert found.perm.shape == (24, 32) and found.fallback == ()
    assert_optimal(heads, found.perm, unique=True)
    nested = torch.rand(2, 3, 16, 16, generator=g, dtype=torch.float64)  # any batch shape
    found = auction_assignment(nested)
    assert found.perm.shape == (2, 3, 16) and found.prices.shape == (2, 3, 16)
    assert_optimal(nested, found.perm, unique=True)


def test_exact_ties_are_certified_optimal():
    g = torch.Generator().manual_seed(1)
    few_values = torch.randint(0, 3, (12, 40, 40), generator=g).float()  # many optimal assignments
    found = auction_assignment(few_values)
    assert found.fallback == ()  # integer entries: the duality gap below 1 proves them
    assert_optimal(few_values, found.perm)
    equal_rows = torch.rand(48, 1, generator=g).expand(48, 48)  # every assignment is optimal
    constant = torch.full((48, 48), 0.5)
    for s in (equal_rows, constant, torch.zeros(5, 5)):
        found = auction_assignment(s)
        assert found.fallback == ()
        assert_optimal(s, found.perm)


def test_costs_closer_than_float32_resolves_are_told_apart():
    g = torch.Generator().manual_seed(2)
    n = 48
    # every assignment of a_i + b_j is worth the same: the 1e-7 relative perturbation alone decides
    base = torch.rand(n, 1, generator=g, dtype=torch.float64) + torch.rand(1, n, generator=g, dtype=torch.float64)
    s = base + 1e-7 * torch.rand(n, n, generator=g, dtype=torch.float64)
    found = auction_assignment(s)
    assert_optimal(s, found.perm, unique=True)


def test_a_failed_certificate_hands_the_problem_to_scipy_and_says_so(monkeypatch):
    g = torch.Generator().manual_seed(3)
    s = torch.rand(6, 24, 24, generator=g)

    def refuted(s, p, perm, tie, rounds):
        return torch.zeros(len(s), dtype=torch.bool, device=s.device), p, rounds

    monkeypatch.setattr(device_assignment, "relax_prices", refuted)
    found = auction_assignment(s)
    assert found.fallback == tuple(range(6))
    assert_optimal(s, found.perm, unique=True)


def test_a_thousand_units():
    g = torch.Generator().manual_seed(4)
    n = 1024
    # a latent some way from its permutation: the rows' maxima collide and the auction bids
    s = torch.eye(n)[torch.randperm(n, generator=g)] + 0.18 * torch.randn(n, n, generator=g)
    found = auction_assignment(s)
    assert found.rounds > 10 and found.fallback == ()
    assert_optimal(s, found.perm, unique=True)


def test_rectangular_empty_and_non_finite_problems():
    with pytest.raises(ValueError, match=r"square \(\.\.\., n, n\) problems, got shape \(3, 4\)"):
        auction_assignment(torch.rand(3, 4))
    with pytest.raises(ValueError, match="square"):
        auction_assignment(torch.rand(5))
    s = torch.rand(4, 6, 6)
    s[2, 1, 3] = float("nan")
    with pytest.raises(ValueError, match=r"problem 2 of 4 has NaN or infinite entries"):
        auction_assignment(s)
    s = torch.rand(2, 3, 5, 5)
    s[1, 0, 4, 4] = float("inf")
    with pytest.raises(ValueError, match=r"problem \(1, 0\) of batch \(2, 3\)"):
        auction_assignment(s)
    assert auction_assignment(torch.rand(7, 1, 1)).perm.tolist() == [[0]] * 7
    assert auction_assignment(torch.rand(0, 0)).perm.shape == (0,)


def test_warm_start_gives_the_same_answers_in_fewer_rounds():
    g = torch.Generator().manual_seed(5)
    n = 64
    s = torch.rand(n, n, generator=g)
    first = auction_assignment(s)
    # moved a little: the last answer, still optimal, is certified without bidding
    moved = s + 1e-4 * torch.randn(n, n, generator=g)
    warm, cold = auction_assignment(moved, first.prices, first.perm), auction_assignment(moved)
    assert torch.equal(warm.perm, cold.perm) and warm.rounds == 0 < cold.rounds
    # moved, and two rows made to swap their columns: the warm auction bids for those rows alone
    g = torch.Generator().manual_seed(0)
    latent = torch.eye(n) + 0.3 * torch.randn(n, n, generator=g)
    first = auction_assignment(latent)
    moved, (i, k), p = latent + 1e-3 * torch.randn(n, n, generator=g), (3, 40), first.perm
    moved[[i, k], p[[k, i]]] += (latent[[i, k], p[[i, k]]].sum() - latent[[i, k], p[[k, i]]].sum()) / 2 + 0.01
    warm, cold = auction_assignment(moved, first.prices, first.perm), auction_assignment(moved)
    assert not torch.equal(first.perm, cold.perm)
    assert torch.equal(warm.perm, cold.perm) and warm.rounds < cold.rounds
    assert_optimal(moved, warm.perm, unique=True)
    # prices alone, a problem without a permutation (-1s) and absurd prices: only where bidding starts
    batch = torch.stack([s, latent])
    perm = torch.stack([first.perm, torch.full((n,), -1)])
    for prices in (torch.zeros(2, n), 1e3 * torch.rand(2, n, generator=g)):
        for start in (None, perm):
            assert_optimal(batch, auction_assignment(batch, prices, start).perm, unique=True)


def test_answers_are_kept_per_key_and_batched_by_size():
    g = torch.Generator().manual_seed(6)
    problems = {f"mlp.{i}": torch.randn(16, 16, generator=g) for i in range(3)} | {"heads.0": torch.randn(4, 4)}
    solver = DeviceAssignments()
    found = solver.project(problems)
    for key, s in problems.items():
        assert_optimal(s, found[key].perm, unique=True)
    assert solver.counts["solved"] == 4 and solver.counts["fallback"] == 0 and solver.counts["rounds"] > 0
    rounds = solver.counts["rounds"]
    again = solver.project({k: s + 1e-6 for k, s in problems.items()})  # the same optimum: no bidding
    assert all(torch.equal(again[k].perm, found[k].perm) for k in problems)
    assert solver.counts["rounds"] == rounds and set(solver.states) == set(problems)


@pytest.mark.gpu
def test_the_solver_runs_on_cuda_tensors():
    g = torch.Generator().manual_seed(7)
    s = torch.rand(8, 96, 96, generator=g)
    found = auction_assignment(s.cuda())
    assert found.perm.is_cuda and found.prices.is_cuda
    assert_optimal(s, found.perm, unique=True)
    warm = auction_assignment(s.cuda() + 1e-5, found.prices, found.perm)
    assert warm.perm.is_cuda and torch.equal(warm.perm, found.perm) and warm.rounds == 0


@pytest.mark.filterwarnings("ignore:You are trying to `self.log")  # a step outside a Trainer logs nothing
def test_learned_steps_take_the_same_hard_permutations_on_the_device_solver():
    a, b = (to_canonical(tiny_vit(seed, hidden=16, heads=2, mlp=32)) for seed in (0, 1))
    spaces = [s for s in SymmetrySpec.from_model(b) if s.kind in ("residual", "heads", "mlp")]
    kinds = {s.name: "orthogonal" if s.kind == "residual" else "permutation" for s in spaces}
    init = {s.name: torch.eye(s.size) for s in spaces}
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 1, 8, 8, generator=g), torch.randint(0, 10, (16,), generator=g)
    modules = {}
    for where in ("host", "device"):
        settings = LearnedSettings(max_steps=4, init_noise=0.4, lr=0.05, assignment=where)
        modules[where] = LearnedMatchingModule(a, b, init, kinds, settings, b.task)
    optimizers = {k: torch.optim.SGD(m.latents.parameters(), lr=0.5) for k, m in modules.items()}
    for _ in range(4):
        hard = {}
        for where, module in modules.items():
            elements = module.elements()
            hard[where] = {n: e[1] for n, e in elements.items() if kinds[n] == "permutation"}
            optimizers[where].zero_grad()
            module.loss(x, y, 0.5).backward()
            optimizers[where].step()
        assert all(torch.equal(hard["host"][n], hard["device"][n]) for n in hard["host"])
    assert modules["device"]._auction.counts["solved"] > 0  # the rows' maxima did not decide them all
    assert not modules["host"]._auction.counts["solved"]
    with pytest.raises(ValueError, match="assignment=gpu: choose one of auto, host, device"):
        LearnedSettings(assignment="gpu")
