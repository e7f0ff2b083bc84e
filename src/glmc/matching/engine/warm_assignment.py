"""Assignments that carry over from one weight-matching iteration to the next, by two LP-duality certificates.

* **exact**: sigma maximises sum_i S[i, sigma(i)] iff column potentials v exist with S[i, j] - v[j] <=
  S[i, sigma(i)] - v[sigma(i)]; longest-path relaxation from the last potentials finds them in a few
  O(n^2) rounds when sigma is still optimal, instead of a full solve.
* **radius**: if that holds with every arc gaining 2 eps, sigma is optimal for every S' within eps of S;
  MLP similarities are cosines of rows the residual map R rotates, so |S(R') - S(R)| <= ||R' - R||_2:
  while R stays within the radius, neither the similarity nor the solve is needed.

A fresh assignment of a large layer is solved on each row's best candidates by a sparse solver and
proved optimal on the whole matrix by the exact certificate; where the candidates' potentials leave arcs of
the whole matrix violated, those arcs join the candidates and the sparse solver runs again (pricing), the
dense solver deciding after PRICING_ROUNDS.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import min_weight_full_bipartite_matching
from torch import Tensor

from glmc.matching.engine.device_assignment import device_project, solves_on_device
from glmc.matching.engine.projections import decomposed
from glmc.symmetry import Permutation
from glmc.threads import GRAIN, one_thread

# relaxation rounds before a certificate (or, sooner, a radius) is given up (measured: under twenty)
MAX_ROUNDS = 32
RADIUS_ROUNDS = 16
# a residual map that moved this far (Frobenius) since the last solve is not checked against it
MAX_MOVE = 1.0
# radii tried, smallest first: a tenth, once and ten times the map's last move up to MAX_RADIUS, else RADII
RADII = (1e-2, 5e-3, 2e-3, 1e-3, 1e-4, 1e-5)
MAX_RADIUS = 1e-2
# float32 similarities' error per entry of magnitude one: a skip needs the move plus this inside the radius
FLOAT_SLACK = 1e-6
# ties in float64: an alternative this close to as good per arc does not refute a certificate
TIE = 1e-12
# arcs relaxed at a time: the (rows, n) float64 sums stay in cache (8x faster than all at once)
CHUNK = 256
# fresh assignments of SPARSE_UNITS or more: solved on each row's CANDIDATES largest entries (64 missed
# no GPT-2 layer's optimum, 32 missed two of twelve), kept where potentials from at most FRESH_ROUNDS
# rounds of relaxation over the candidates' arcs prove them on the whole matrix
SPARSE_UNITS = 1024
CANDIDATES = 64
FRESH_ROUNDS = 256
# candidates' solves whose potentials still leave arcs violated: each adds every violating row's PRICED worst
# arcs and solves again (a missed optimum needs one or two; relaxing all arcs instead took thousands of
# rounds to give up on a Pythia-160M layer before the dense solver ran)
PRICING_ROUNDS = 8
PRICED = 64


def arc_weights(similarity: Tensor, perm: Tensor) -> Tensor:
    """(n, n) float64: entry [k, j] is the arc k -> j, S[r, j] - S[r, k] for the row r assigned to
    column k (exact: a difference of float32 numbers); -inf on the diagonal."""
    s = similarity.detach()
    rows = Permutation(perm).inverse().perm  # row k: the row assigned to column k
    arcs = s.index_select(0, rows).double()
    arcs -= arcs.diagonal().clone()[:, None]
    return arcs.fill_diagonal_(-math.inf)


def potentials(
    arcs: Tensor, start: Tensor | None = None, margin: float = 0.0, rounds: int = MAX_ROUNDS
) -> Tensor | None:
    """Column potentials v with v[j] >= v[k] + arc(k -> j) + margin for all k != j, by longest-path
    relaxation from `start` (zeros if None); None where none appear within `rounds` rounds (a
    positive cycle: the permutation is not optimal, or not by that margin)."""
    return relax(arcs, start, margin, rounds)[0]


def relax(arcs: Tensor, start: Tensor | None, margin: float, rounds: int) -> tuple[Tensor | None, int]:
    """potentials(), with the number of rounds it took (on one thread where torch would split its
    operations: its rounds are many short ones, each waiting for its slowest thread)."""
    if min(CHUNK, arcs.shape[0]) * arcs.shape[-1] < GRAIN:  # not split: the thread count stays
        return _relax(arcs, start, margin, rounds)
    with one_thread():
        return _relax(arcs, start, margin, rounds)


def _relax(arcs: Tensor, start: Tensor | None, margin: float, rounds: int) -> tuple[Tensor | None, int]:
    n = arcs.shape[0]
    v = torch.zeros(n, dtype=arcs.dtype, device=arcs.device) if start is None else start.clone()
    # Only the columns whose potential rose in the last round can raise another one in this round: the
    # rest were relaxed at the values they still hold (the same rounds and potentials, less work).
    active = None
    for done in range(rounds):
        if active is not None and 2 * len(active) > n:  # most columns rose: one pass over all of them
            active = None  # reads the arcs in place, cheaper than gathering most of their rows
        best = torch.full_like(v, -math.inf)
        for i in range(0, n if active is None else len(active), CHUNK):
            if active is None:
                rows, from_v = arcs[i : i + CHUNK], v[i : i + CHUNK]
            else:
                chunk = active[i : i + CHUNK]
                rows, from_v = arcs.index_select(0, chunk), v.index_select(0, chunk)
            best = torch.maximum(best, (rows + from_v[:, None]).amax(0))
        if bool(best.isnan().any()):  # a non-finite similarity certifies nothing
            return None, rounds
        relaxed = torch.maximum(v, best + (margin - TIE))
        rose = relaxed > v
        if not bool(rose.any()):
            return v, done + 1
        active = rose.nonzero().squeeze(1)
        v = relaxed
    return None, rounds


def is_optimal(similarity: Tensor, perm: Tensor, start: Tensor | None = None) -> bool:
    """Whether `perm` maximises sum_i similarity[i, perm[i]] (to within float64 ties)."""
    return potentials(arc_weights(similarity, perm), start) is not None


def candidate_assignment(similarity: Tensor, candidates: int = CANDIDATES) -> tuple[Tensor, Tensor, Tensor] | None:
    """(columns, values, candidate columns): the assignment maximising the sum over each row's `candidates`
    largest entries only (SciPy's sparse solver), with those entries; None where they hold none complete."""
    s = similarity.detach()
    n = s.shape[0]
    host = (s.float() if s.dtype in (torch.float16, torch.bfloat16) else s).cpu().numpy()  # (exact)
    m = min(candidates, n)
    # a partial partition per row (about half the time of a sorted top-k), CHUNK rows at a time: its
    # (rows, n) index temporaries stay small (the whole matrix's were twice the similarity's size)
    columns = np.empty((n, m), dtype=np.int64)
    for i in range(0, n, CHUNK):
        columns[i : i + CHUNK] = np.argpartition(host[i : i + CHUNK], n - m, axis=1)[:, n - m :]
    as_tensor = lambda a: torch.as_tensor(a, device=s.device)  # noqa: E731
    values, columns = as_tensor(np.take_along_axis(host, columns, axis=1)), as_tensor(columns)
    perm = sparse_assignment(values, columns)
    return None if perm is None else (perm, values, columns)


def sparse_assignment(values: Tensor, columns: Tensor) -> Tensor | None:
    """The assignment maximising the sum over the entries given: row i's are values[i] at columns[i]
    (-inf: a slot left empty), each (row, column) once; None where they hold no complete assignment."""
    host_values, host_columns = values.cpu().numpy(), columns.cpu().numpy()
    n = host_columns.shape[0]
    given = host_values != -np.inf
    rows = np.broadcast_to(np.arange(n)[:, None], host_columns.shape)[given]
    # shifted to be positive: the sparse solver must not take a zero similarity for a missing entry
    graph = csr_matrix((host_values[given].astype(np.float64) + 2.0, (rows, host_columns[given])), shape=(n, n))
    try:
        _, cols = min_weight_full_bipartite_matching(graph, maximize=True)
    except ValueError:  # no perfect matching among the entries
        return None
    return torch.as_tensor(cols, device=values.device).long()


def candidate_potentials(
    similarity: Tensor,
    perm: Tensor,
    values: Tensor,
    columns: Tensor,
    rounds: int = FRESH_ROUNDS,
    start: Tensor | None = None,
) -> tuple[Tensor | None, int]:
    """relax() on the arcs among each row's candidates only (from `start`, zeros if None): cheap rounds,
    whose potentials one pass over the whole matrix (`holds`) usually confirms; on one thread, as relax()."""
    with one_thread():
        return _candidate_potentials(similarity, perm, values, columns, rounds, start)


def _candidate_potentials(
    similarity: Tensor, perm: Tensor, values: Tensor, columns: Tensor, rounds: int, start: Tensor | None
) -> tuple[Tensor | None, int]:
    s = similarity.detach()
    n = len(perm)
    rows = Permutation(perm).inverse().perm
    own = s[rows, torch.arange(n, device=s.device)].double()  # S[r, k] for the row r assigned to k
    weights = values.index_select(0, rows).double() - own[:, None]
    targets = columns.index_select(0, rows)
    v = torch.zeros(n, dtype=torch.float64, device=s.device) if start is None else start.clone()
    active = torch.arange(n, device=s.device)  # as relax(): only the columns that rose reach further
    for done in range(rounds):
        reached = v.index_select(0, active)[:, None] + weights.index_select(0, active) - TIE
        to = targets.index_select(0, active).reshape(-1)
        relaxed = v.scatter_reduce(0, to, reached.reshape(-1), "amax")  # includes v itself: never lower
        rose = relaxed > v
        if not bool(rose.any()):
            return v, done + 1
        active, v = rose.nonzero().squeeze(1), relaxed
    return None, rounds


def violations(similarity: Tensor, perm: Tensor, v: Tensor, most: int = PRICED) -> tuple[Tensor, Tensor] | None:
    """The arcs of the whole matrix that potentials v leave violated (to within 2 TIE), in float64: each
    violating row's `most` worst as (rows, columns), empty where v proves `perm` optimal; None where an entry
    is not finite (nothing is proved). On one thread, as relax()."""
    s = similarity.detach()
    slack = s.gather(1, perm[:, None]).squeeze(1).double() - v.index_select(0, perm) + 2 * TIE
    # one (CHUNK, n) float64 buffer for every chunk: a fresh one each time costs its pages again
    gap = torch.empty(min(CHUNK, s.shape[0]), s.shape[1], dtype=torch.float64, device=s.device)
    found_rows, found_columns = [], []
    with one_thread():
        for i in range(0, s.shape[0], CHUNK):
            part = gap[: min(CHUNK, s.shape[0] - i)]
            torch.sub(s[i : i + CHUNK], v[None, :], out=part).sub_(slack[i : i + CHUNK, None])
            worst = part.amax(1)
            if not bool(worst.isfinite().all()):
                return None
            bad = (worst > 0).nonzero().squeeze(1)
            if len(bad):
                top, where = part.index_select(0, bad).topk(min(most, part.shape[1]), dim=1)
                violated = top > 0
                found_rows.append((bad + i)[:, None].expand_as(where)[violated])
                found_columns.append(where[violated])
    if not found_rows:
        empty = torch.empty(0, dtype=torch.long, device=s.device)
        return empty, empty
    return torch.cat(found_rows), torch.cat(found_columns)


def holds(similarity: Tensor, perm: Tensor, v: Tensor) -> bool:
    """Whether potentials v prove `perm` optimal over the whole matrix (to within 2 TIE); a NaN fails."""
    found = violations(similarity, perm, v, most=1)
    return found is not None and len(found[0]) == 0


def widened(similarity: Tensor, values: Tensor, columns: Tensor, rows: Tensor, new: Tensor) -> tuple[Tensor, Tensor]:
    """The candidates (values, columns) with the arcs (rows, new) added (those already there left out):
    slots a row does not fill hold -inf at its first column."""
    there = (columns.index_select(0, rows) == new[:, None]).any(1)
    rows, new = rows[~there], new[~there]
    n = columns.shape[0]
    counts = torch.bincount(rows, minlength=n)
    extra = int(counts.max()) if len(rows) else 0
    order = torch.argsort(rows, stable=True)
    rows, new = rows[order], new[order]
    slot = torch.arange(len(rows), device=rows.device) - (torch.cumsum(counts, 0) - counts).index_select(0, rows)
    more_columns = columns[:, :1].repeat(1, extra)
    more_values = torch.full((n, extra), -math.inf, dtype=values.dtype, device=values.device)
    more_columns[rows, slot] = new
    more_values[rows, slot] = similarity.detach()[rows, new].to(values.dtype)
    return torch.cat([values, more_values], 1), torch.cat([columns, more_columns], 1)


def priced(
    similarity: Tensor, perm: Tensor, values: Tensor, columns: Tensor, rounds: int = PRICING_ROUNDS
) -> tuple[Permutation, Tensor, int] | None:
    """The candidates' assignment proved optimal on the whole matrix: (permutation, potentials, relaxation
    rounds), or None. The candidates' arcs are relaxed; while arcs of the whole matrix violate those
    potentials, at most `rounds` times, they join the candidates (each time arcs they lacked) and the sparse
    solver and the relaxation run again."""
    v, spent = candidate_potentials(similarity, perm, values, columns)
    for done in range(rounds + 1):
        found = None if v is None else violations(similarity, perm, v)
        if found is None:
            return None
        if not len(found[0]):
            return Permutation(perm), v, spent
        if done == rounds:
            return None
        values, columns = widened(similarity, values, columns, *found)
        perm = sparse_assignment(values, columns)
        if perm is None:
            return None
        # from the last potentials: where the assignment stayed, only the new arcs move them
        v, used = candidate_potentials(similarity, perm, values, columns, start=v)
        spent += used


def fresh_assignment(similarity: Tensor) -> tuple[Permutation, Tensor | None, int]:
    """The assignment maximising `similarity` (as Permutation.project), with the potentials and rounds
    of the certificate that proved it where one did (None, 0 after the dense solver)."""
    s = similarity.detach()
    shortcut = Permutation.from_row_maxima(s)
    # (a non-finite entry fails the certificate, and the dense solver reports it); the device's own
    # solver, where it wins, rather than a host copy for the sparse one
    if shortcut is None and s.dim() == 2 and not solves_on_device(s) and s.shape[0] == s.shape[1] >= SPARSE_UNITS:
        found = candidate_assignment(s)
        proved = None if found is None else priced(s, *found)
        if proved is not None:
            return proved
    return shortcut or device_project(s), None, 0


def spectral_norm_bound(matrix: Tensor) -> float:
    """An upper bound on ||matrix||_2 within a part in 1e9: the largest eigenvalue of M^T M in
    float64, raised by more than its rounding error."""
    m = matrix.detach().double()
    gram = m.T @ m if m.shape[0] >= m.shape[1] else m @ m.T
    top = float(decomposed(torch.linalg.eigvalsh, gram)[-1].clamp_min(0.0))
    return math.sqrt(top * (1.0 + 1e-9) + 1e-300)


@dataclass
class _State:
    perm: Permutation
    v: Tensor | None  # potentials of the last certificate, None after a solve (not computed until needed)
    rounds: int  # the rounds they took: a later certificate that needs many more is given up
    reference: Tensor | None  # the map the similarity was computed at (for `solve`)
    radius: float  # how far its entries may move (0 where no radius was certified)
    slack: float  # how far they may be off in float32
    # (a map R_s, a bound on ||R_s - reference||_2): adding ||R - R_s||_F bounds R's move cheaply
    spectral: tuple[Tensor, float] | None = None


class WarmAssignments:
    """Assignments kept per key (a layer, a latent) while a certificate above says they are still
    optimal. Calls for different keys may run in different threads: keys share no state."""

    def __init__(self) -> None:
        self.states: dict[object, _State] = {}
        self.counts = {"skipped": 0, "certified": 0, "solved": 0}
        # shared by the layers (and threads) of one iteration: the map as passed and its stored copy,
        # and the spectral moves between stored maps
        self._lock = threading.Lock()
        self._stored: tuple[Tensor, Tensor] | None = None
        self._moves: dict[tuple[int, int], tuple[Tensor, Tensor, float]] = {}

    def __getstate__(self) -> dict:  # spawned processes (DDP) get the states, a lock of their own
        return {"states": self.states, "counts": self.counts}

    def __setstate__(self, state: dict) -> None:
        self.__init__()
        self.states, self.counts = state["states"], state["counts"]

    def _count(self, what: str) -> None:
        with self._lock:
            self.counts[what] += 1

    def _store(self, reference: Tensor) -> Tensor:
        """One stored copy of a map, whichever layers pass it."""
        with self._lock:
            if self._stored is None or self._stored[0] is not reference:
                self._stored = (reference, reference.detach().clone())
            return self._stored[1]

    def _spectral_move(self, previous: Tensor, current: Tensor) -> float:
        """||current - previous||_2 (bounded from above), computed once per pair of stored maps."""
        with self._lock:
            hit = self._moves.get((id(previous), id(current)))
            if hit is None or hit[0] is not previous or hit[1] is not current:
                if len(self._moves) >= 8:  # the maps of earlier iterations are not asked for again
                    self._moves.clear()
                hit = (previous, current, spectral_norm_bound(current.double() - previous.double()))
                self._moves[(id(previous), id(current))] = hit
            return hit[2]

    def _certify(self, state: _State | None, s: Tensor) -> tuple[Tensor, Tensor, int] | None:
        """(arcs, potentials, rounds) proving the state's permutation optimal for s, or None."""
        if state is None:
            return None
        arcs = arc_weights(s, state.perm.perm)
        cap = MAX_ROUNDS if state.v is None else min(MAX_ROUNDS, 2 * state.rounds + 4)
        v, rounds = relax(arcs, state.v, 0.0, cap)
        return None if v is None else (arcs, v, rounds)

    def project(self, key: object, similarity: Tensor) -> Permutation:
        """The assignment maximising `similarity` (as Permutation.project), the key's previous one
        where it is still optimal: relaxation runs on the similarity's device, the solver on the host."""
        state, s = self.states.get(key), similarity.detach()
        proof = self._certify(state, s)
        if proof is not None:
            self._count("certified")
            self.states[key] = _State(state.perm, proof[1], proof[2], None, 0.0, 0.0)
            return state.perm
        self._count("solved")
        perm, v, rounds = fresh_assignment(s)
        self.states[key] = _State(perm, v, rounds, None, 0.0, 0.0)
        return perm

    def _move(self, state: _State, current: Tensor, frobenius: float, within: Callable[[float], float]) -> float:
        """A bound on ||current - state.reference||_2: the Frobenius norm where that keeps the radius or
        nothing could; else the last spectral bound plus the Frobenius move since, or a new spectral norm."""
        keeps = lambda move: within(move) + state.slack <= state.radius  # noqa: E731
        if frobenius == 0.0 or keeps(frobenius) or not frobenius < MAX_MOVE:
            return frobenius
        if not keeps(frobenius / math.sqrt(min(current.shape))):  # not even the spectral norm could
            return frobenius
        if state.spectral is not None:
            at, bound = state.spectral
            cheap = bound + float((current.double() - at.double()).norm())
            if keeps(cheap):
                return cheap
        bound = self._spectral_move(state.reference, current)
        state.spectral = (current, bound)  # the state belongs to this key's call alone
        return min(frobenius, bound)

    def kept(self, reference: Tensor, layer: int, within: Callable[[float], float] = float) -> Permutation | None:
        """The layer's last assignment where `reference` lies inside its certified radius, else None (cheap)."""
        state, current = self.states.get(layer), self._store(reference)
        if state is None:
            return None
        frobenius = float((current.double() - state.reference.double()).norm())
        moved = self._move(state, current, frobenius, within)
        if moved == 0.0 or within(moved) + state.slack <= state.radius:
            self._count("skipped")
            return state.perm
        return None

    def solve(
        self,
        reference: Tensor,
        similarity: Callable[[int], Tensor],
        layer: int,
        within: Callable[[float], float] = float,
    ) -> Permutation:
        """The optimal assignment of similarity(layer), computed at map `reference` (entries at R and R'
        within within(||R' - R||_2)); not computed while `reference` stays inside the certified radius."""
        kept = self.kept(reference, layer, within)
        if kept is not None:
            return kept
        state, current = self.states.get(layer), self._store(reference)
        frobenius = math.inf if state is None else float((current.double() - state.reference.double()).norm())
        moved = frobenius if state is None else self._move(state, current, frobenius, within)
        s = similarity(layer)
        # a move as large as the unit rows reshuffles their cosines: straight to the solver
        proof = self._certify(state, s) if frobenius < MAX_MOVE else None
        if proof is None:
            self._count("solved")
            perm, v, rounds = fresh_assignment(s)
            self.states[layer] = _State(perm, v, rounds, current, 0.0, 0.0)
            return perm
        self._count("certified")
        arcs, v, rounds = proof
        moves = tuple(m for m in (10 * moved, moved, moved / 10) if m <= MAX_RADIUS) or RADII
        cap = min(RADIUS_ROUNDS, 2 * rounds + 4)
        # smallest first, from the last potentials; a radius that fails costs the whole cap, so stop there
        radius, start = 0.0, v
        for m in sorted(moves):
            start = potentials(arcs, start, 2 * within(m), cap)
            if start is None:
                break
            radius = within(m)
        slack = FLOAT_SLACK * max(1.0, float(s.abs().max()))  # float32 errors grow with the entries
        self.states[layer] = _State(state.perm, v, rounds, current, radius, slack)
        return state.perm
