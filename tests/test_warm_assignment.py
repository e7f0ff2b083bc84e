"""The certificates that let weight matching keep an MLP assignment: exact optimality, a radius that
holds under perturbation, and a search that returns what recomputing every iteration returns."""

from __future__ import annotations

import pytest
import torch
from scipy.optimize import linear_sum_assignment

from glmc.matching.engine.assignment import PARALLEL_UNITS
from glmc.matching.engine.circuits import circuit_cost, circuit_move, circuit_norms
from glmc.matching.engine.mlp_units import mlp_similarity
from glmc.matching.engine.warm_assignment import (
    CHUNK,
    RADII,
    SPARSE_UNITS,
    TIE,
    WarmAssignments,
    arc_weights,
    candidate_assignment,
    candidate_potentials,
    fresh_assignment,
    holds,
    is_optimal,
    potentials,
    priced,
    relax,
    spectral_norm_bound,
    violations,
)
from glmc.matching.weight import weight_matching
from glmc.models import to_canonical
from glmc.symmetry import Orthogonal, Permutation, SymmetrySpec, Transform, apply, apply_params

from tiny_hf import tiny_gpt2, tiny_vit

pytestmark = pytest.mark.numeric


def value(s: torch.Tensor, perm: torch.Tensor) -> float:
    return float(s.double()[torch.arange(len(perm)), perm].sum())


def scipy_perm(s: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(linear_sum_assignment(s.double().numpy(), maximize=True)[1])


def cosines(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(n, 32, generator=g), torch.randn(n, 32, generator=g)
    a, b = a / a.norm(dim=1, keepdim=True), b / b.norm(dim=1, keepdim=True)
    return a @ b.T


@pytest.mark.parametrize("n,seed", [(7, 0), (64, 1), (200, 2)])
def test_the_optimum_is_certified_and_a_worse_assignment_refuted(n, seed):
    s = cosines(n, seed)
    best = scipy_perm(s)
    assert is_optimal(s, best)
    # swap the two columns whose exchange costs least: strictly worse, and refuted
    worse = best.clone()
    i, j = 0, 1
    worse[i], worse[j] = best[j], best[i]
    assert value(s, worse) < value(s, best) - 1e-9
    assert not is_optimal(s, worse)
    # a random permutation is refuted too
    assert not is_optimal(s, torch.randperm(n, generator=torch.Generator().manual_seed(seed)))


def test_a_certified_radius_holds_for_every_perturbation_inside_it():
    s = cosines(120, 5)
    best = scipy_perm(s)
    arcs = arc_weights(s, best)
    v = potentials(arcs)
    assert v is not None
    radius = next((r for r in (0.1, 0.03, 0.01, 3e-3, *RADII) if potentials(arcs, v, 2 * r) is not None), None)
    assert radius is not None and potentials(arcs, v, 2 * 0.5) is None  # a radius of 0.5 reshuffles cosines
    g = torch.Generator().manual_seed(6)
    for _ in range(20):
        noisy = s + radius * (2 * torch.rand(s.shape, generator=g) - 1)  # |change| <= radius
        found = scipy_perm(noisy)
        # the certified assignment is still optimal (ties aside: the same value as the solver's)
        assert value(noisy, best) >= value(noisy, found) - 1e-9 * n_abs(noisy)


def n_abs(s: torch.Tensor) -> float:
    return float(s.abs().sum())


def test_warm_assignments_skip_inside_the_radius_and_resolve_outside():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(50, 16, generator=g), torch.randn(50, 16, generator=g)
    a, b = a / a.norm(dim=1, keepdim=True), b / b.norm(dim=1, keepdim=True)
    calls = []

    def similarity(r: torch.Tensor, layer: int) -> torch.Tensor:
        calls.append(layer)
        return a @ (b @ r.T).T  # cosines of A's rows with B's rows rotated by r

    warm = WarmAssignments()
    r0 = torch.eye(16)
    first = warm.solve(r0, lambda l: similarity(r0, l), 0)
    assert torch.equal(first.perm, scipy_perm(similarity(r0, 0)))
    calls.clear()
    assert torch.equal(warm.solve(r0, lambda l: similarity(r0, l), 0).perm, first.perm) and not calls
    # a tiny rotation: inside any certified radius, or else certified again from the new matrix
    tiny = Orthogonal.project(torch.eye(16) + 1e-7 * torch.randn(16, 16, generator=g)).matrix
    kept = warm.solve(tiny, lambda l: similarity(tiny, l), 0)
    assert torch.equal(kept.perm, scipy_perm(similarity(tiny, 0)))
    # far away: solved afresh, the solver's answer
    far = Orthogonal.sample(16, generator=g).matrix
    moved = warm.solve(far, lambda l: similarity(far, l), 0)
    s_far = similarity(far, 0)
    assert value(s_far, moved.perm) == pytest.approx(value(s_far, scipy_perm(s_far)))
    assert warm.counts["solved"] >= 2 and sum(warm.counts.values()) == 4


@pytest.mark.parametrize("build", [tiny_vit, tiny_gpt2])
@pytest.mark.parametrize("residual", ["orthogonal", "permutation"])
def test_weight_matching_reusing_work_finds_what_recomputing_finds(build, residual):
    # MLPs of PARALLEL_UNITS units, where weight matching keeps its assignments; B is A under a hidden
    # symmetry plus noise, so that the search settles and its assignments carry over
    a = to_canonical(build(seed=0, mlp=PARALLEL_UNITS))
    g = torch.Generator().manual_seed(1)
    hidden = Transform.sample(
        SymmetrySpec.from_model(a), {"residual": residual, "heads": "permutation", "mlp": "permutation"}, g
    )
    b = apply(hidden, a)
    with torch.no_grad():
        for p in b.params().values():
            p.add_(0.05 * p.std() * torch.randn(p.shape, generator=g))
    kept, kept_diag = weight_matching(a, b, residual, max_iter=8, tol=-float("inf"))
    fresh, fresh_diag = weight_matching(a, b, residual, max_iter=8, tol=-float("inf"), reuse=False)
    for kind in ("mlp_assignments", "head_assignments"):
        counts = kept_diag[kind]
        assert sum(counts.values()) == 8 * a.num_layers and counts["skipped"] + counts["certified"] > 0, kind
        assert kind not in fresh_diag
    assert kept_diag["objective"] == pytest.approx(fresh_diag["objective"], rel=1e-6)
    for name, g in fresh.items():
        if isinstance(g, Permutation):
            assert torch.equal(kept[name].perm, g.perm), name
        else:
            assert torch.allclose(kept[name].matrix, g.matrix, atol=1e-5), name


def rotated_pairs(seed: int):
    """Per scale (1e-4, 1e-2, 0.3), B's weights under a random rotation r and under one near it, with
    A's weights and the spectral norm of the move: (pa, pb at r, pb at r2, r, r2, move)."""
    a, b = to_canonical(tiny_gpt2(seed=0)), to_canonical(tiny_gpt2(seed=1))
    spec = SymmetrySpec.from_model(b)
    pa, pb = dict(a.params()), dict(b.params())
    g = torch.Generator().manual_seed(seed)
    r = Orthogonal.sample(a.width, generator=g).matrix
    for scale in (1e-4, 1e-2, 0.3):
        skew = scale * torch.randn(a.width, a.width, generator=g)
        r2 = torch.linalg.matrix_exp(skew - skew.T) @ r  # another rotation near r
        at = [apply_params(Transform({"residual": Orthogonal(m)}), spec, pb) for m in (r, r2)]
        yield pa, pb, at, r, r2, spectral_norm_bound(r2 - r)


def test_head_costs_move_by_at_most_the_circuit_bound():
    for pa, pb, at, _, _, move in rotated_pairs(2):
        costs = [circuit_cost(pa, p, 0) for p in at]
        bound = circuit_move(float(circuit_norms(pb, 0).max()), move)
        change = float((costs[1] - costs[0]).abs().max())
        assert 0 < change <= bound * (1 + 1e-4) + 1e-5


def test_mlp_cosines_move_by_at_most_the_spectral_norm_of_the_move():
    for pa, _, at, r, r2, move in rotated_pairs(3):
        sims = [mlp_similarity(pa, p, 0) for p in at]
        change = float((sims[1] - sims[0]).abs().max())
        assert 0 < change <= move + 1e-6  # float32 cosines
        assert move < 0.5 * float((r2 - r).norm())  # far tighter than the Frobenius norm


def test_the_spectral_norm_bound_lies_just_above_the_norm():
    g = torch.Generator().manual_seed(4)
    for shape, scale in (((64, 64), 1e-6), ((40, 70), 1.0), ((300, 300), 1e-2)):
        m = scale * torch.randn(shape, generator=g, dtype=torch.float64)
        norm = float(torch.linalg.matrix_norm(m, 2))
        assert norm <= spectral_norm_bound(m) <= norm * (1 + 1e-8)
    assert spectral_norm_bound(torch.zeros(5, 5)) < 1e-100


def jacobi_rounds(arcs: torch.Tensor, margin: float, rounds: int):
    """Longest-path relaxation over every arc in every round: what relax computes with less work."""
    v = torch.zeros(arcs.shape[0], dtype=arcs.dtype)
    for done in range(rounds):
        relaxed = torch.maximum(v, (arcs + v[:, None]).amax(0) + (margin - TIE))
        if torch.equal(relaxed, v):
            return v, done + 1
        v = relaxed
    return None, rounds


@pytest.mark.parametrize("margin", [0.0, 1e-3])
def test_relaxing_the_columns_that_rose_gives_the_full_rounds_potentials(margin):
    s = cosines(3 * CHUNK + 17, 7)  # several chunks, the last one short
    arcs = arc_weights(s, scipy_perm(s))
    v, rounds = relax(arcs, None, margin, 200)
    expected, expected_rounds = jacobi_rounds(arcs, margin, 200)
    assert rounds == expected_rounds
    assert (v is None) == (expected is None)
    if v is not None:
        assert torch.equal(v, expected) and rounds > 2


def test_a_non_finite_similarity_certifies_nothing():
    s = cosines(20, 8)
    best = scipy_perm(s)
    s[3, 5] = float("nan")
    assert not is_optimal(s, best)


def test_the_candidates_potentials_are_the_full_relaxations_and_hold_on_the_whole_matrix():
    s = cosines(300, 11)
    found = candidate_assignment(s, candidates=24)
    assert found is not None
    perm, values, columns = found
    assert torch.equal(perm, scipy_perm(s))  # the optimum uses candidates only on this matrix
    v, rounds = candidate_potentials(s, perm, values, columns)
    expected, expected_rounds = relax(arc_weights(s, perm), None, 0.0, 300)
    assert v is not None and rounds > 2 and holds(s, perm, v)
    assert torch.allclose(v, expected, rtol=0.0, atol=1e-12 * float(expected.abs().max()))


def test_potentials_do_not_hold_for_a_worse_assignment_or_a_non_finite_entry():
    s = cosines(120, 12)
    best = scipy_perm(s)
    v = potentials(arc_weights(s, best))
    assert v is not None and holds(s, best, v)
    worse = best.clone()
    worse[[0, 1]] = worse[[1, 0]]
    assert value(s, worse) < value(s, best) and not holds(s, worse, v)
    s[4, 9] = float("nan")
    assert not holds(s, best, v)


def test_pricing_adds_the_arcs_a_missed_optimum_needs_and_proves_the_solvers_assignment():
    s = cosines(400, 13)
    best = scipy_perm(s)
    found = candidate_assignment(s, candidates=8)
    assert found is not None
    perm, values, columns = found
    assert not torch.equal(perm, best)  # each row's eight largest entries miss the optimum
    v, _ = candidate_potentials(s, perm, values, columns)
    rows, cols = violations(s, perm, v)
    assert len(rows) and not bool((columns[rows] == cols[:, None]).any())  # arcs the candidates lack
    proved = priced(s, perm, values, columns)
    assert proved is not None
    got, v, rounds = proved
    assert torch.equal(got.perm, best) and rounds > 2 and holds(s, best, v)
    assert value(s, best) > value(s, perm)
    assert priced(s, perm, values, columns, rounds=0) is None  # the candidates alone prove nothing


def test_no_violation_is_reported_for_a_non_finite_matrix():
    s = cosines(50, 14)
    best = scipy_perm(s)
    v = potentials(arc_weights(s, best))
    assert v is not None and violations(s, best, v) is not None
    s[7, 3] = float("inf")
    assert violations(s, best, v) is None and not holds(s, best, v)


def test_a_fresh_assignment_from_each_rows_candidates_is_the_solvers():
    n = SPARSE_UNITS + 30
    s = cosines(n, 9)
    perm, v, rounds = fresh_assignment(s)
    assert v is not None and rounds >= 1  # proved optimal on the whole matrix: no dense solve
    assert torch.equal(perm.perm, scipy_perm(s))
    half = s.bfloat16()  # (NumPy has no bfloat16: the candidates are read in float32)
    perm, v, _ = fresh_assignment(half)
    assert v is not None and value(half, perm.perm) == value(half, scipy_perm(half.float()))
    # every row ranks the same columns first: the candidates hold no complete assignment, and the
    # dense solver decides
    g = torch.Generator().manual_seed(10)
    crowded = torch.linspace(1, 0, n)[None, :] + 1e-3 * torch.rand(n, n, generator=g)
    perm, v, _ = fresh_assignment(crowded)
    assert v is None and torch.equal(perm.perm, scipy_perm(crowded))
