"""Assignments that carry over from one weight-matching iteration to the next.

Late in weight matching the residual map moves by a few parts in a million and every layer's MLP
assignment comes out the same as before. Two certificates from linear-programming duality let an
iteration skip the work instead of redoing it:

* **exact**: a permutation sigma maximises sum_i S[i, sigma(i)] iff there are column potentials v
  with S[i, j] - v[j] <= S[i, sigma(i)] - v[sigma(i)] for all i, j. They exist iff the graph on
  columns with an arc k -> j of weight S[r, j] - S[r, k] (r the row assigned to k) has no positive
  cycle, and longest-path relaxation (Bellman-Ford) finds them. Started from the previous
  iteration's potentials it converges in a few rounds of O(n^2) each, against a full Hungarian
  solve when the previous permutation is still optimal;
* **radius**: if the graph keeps no positive cycle after every arc gains 2 eps, sigma is optimal for
  every S' with |S' - S| <= eps entrywise (a cycle through m arcs changes by at most 2 eps m). MLP
  similarities are cosines of unit rows that the residual map R rotates, so |S(R') - S(R)| <=
  ||R' - R||_2 <= ||R' - R||_F: while R stays within the certified radius of the R that S was
  computed at, neither the similarity nor the solve is needed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from glmc.symmetry import Permutation

# relaxation rounds before a certificate is given up (the Hungarian solve then decides): the longest
# paths of the MLP similarities met so far took under twenty; a radius that does not hold is given
# up sooner
MAX_ROUNDS = 32
RADIUS_ROUNDS = 16
# a residual map that moved this far (Frobenius) since the last solve is not checked against it
MAX_MOVE = 1.0
# radii tried as moves of the map, largest first, the first one certified kept: ten times, once and a
# tenth the map's last move (the next moves of a converging search are smaller) up to MAX_RADIUS,
# else these (a radius that does not hold costs RADIUS_ROUNDS rounds)
RADII = (1e-2, 5e-3, 2e-3, 1e-3, 1e-4, 1e-5)
MAX_RADIUS = 1e-2
# float32 similarities are exact to about this much per entry of magnitude one (a dot product of two
# unit rows of a few thousand entries): a skip needs the map's move plus this inside the radius
FLOAT_SLACK = 1e-6
# ties in float64: an alternative this close to as good per arc does not refute a certificate
TIE = 1e-12
# arcs relaxed at a time: the (rows, n) float64 sums stay in cache (8x faster than all at once)
CHUNK = 256


def arc_weights(similarity: Tensor, perm: Tensor) -> Tensor:
    """(n, n) float64: entry [k, j] is the arc k -> j, S[r, j] - S[r, k] for the row r assigned to
    column k (exact: a difference of float32 numbers); -inf on the diagonal."""
    s = similarity.detach()
    rows = torch.empty_like(perm)
    rows[perm] = torch.arange(len(perm), device=perm.device)
    arcs = s.index_select(0, rows).double()  # row k: the row assigned to column k
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
    """potentials(), with the number of rounds it took."""
    n = arcs.shape[0]
    v = torch.zeros(n, dtype=arcs.dtype, device=arcs.device) if start is None else start.clone()
    for done in range(rounds):
        best = torch.full_like(v, -math.inf)
        for i in range(0, n, CHUNK):
            best = torch.maximum(best, (arcs[i : i + CHUNK] + v[i : i + CHUNK, None]).amax(0))
        relaxed = torch.maximum(v, best + (margin - TIE))
        if torch.equal(relaxed, v):
            return v, done + 1
        v = relaxed
    return None, rounds


def is_optimal(similarity: Tensor, perm: Tensor, start: Tensor | None = None) -> bool:
    """Whether `perm` maximises sum_i similarity[i, perm[i]] (to within float64 ties)."""
    return potentials(arc_weights(similarity, perm), start) is not None


@dataclass
class _State:
    perm: Permutation
    v: Tensor | None  # potentials of the last certificate, None after a solve (not computed until needed)
    rounds: int  # the rounds they took: a later certificate that needs many more is given up
    reference: Tensor | None  # the map the similarity was computed at (for `solve`)
    radius: float  # how far its entries may move (0 where no radius was certified)
    slack: float  # how far they may be off in float32


class WarmAssignments:
    """Assignments kept per key (a layer, a latent) while a certificate above says they are still
    optimal. Calls for different keys may run in different threads: keys share no state."""

    def __init__(self) -> None:
        self.states: dict[object, _State] = {}
        self.counts = {"skipped": 0, "certified": 0, "solved": 0}

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
            self.counts["certified"] += 1
            self.states[key] = _State(state.perm, proof[1], proof[2], None, 0.0, 0.0)
            return state.perm
        self.counts["solved"] += 1
        perm = Permutation.project(s)
        self.states[key] = _State(perm, None, 0, None, 0.0, 0.0)
        return perm

    def solve(
        self,
        reference: Tensor,
        similarity: Callable[[int], Tensor],
        layer: int,
        within: Callable[[float], float] = float,
    ) -> Permutation:
        """The optimal assignment of similarity(layer), a matrix computed at map `reference` whose
        entries at maps R and R' lie within within(||R' - R||_F) of each other (the identity for
        cosines of rows that R rotates): not computed at all while `reference` stays inside the radius
        certified for the layer's last one."""
        state = self.states.get(layer)
        moved = math.inf if state is None else float((reference.double() - state.reference.double()).norm())
        if state is not None and (moved == 0.0 or within(moved) + state.slack <= state.radius):
            self.counts["skipped"] += 1
            return state.perm
        s = similarity(layer)
        # a move as large as the unit rows reshuffles their cosines: straight to the solver
        proof = self._certify(state, s) if moved < MAX_MOVE else None
        if proof is None:
            self.counts["solved"] += 1
            perm = Permutation.project(s)
            self.states[layer] = _State(perm, None, 0, reference.detach().clone(), 0.0, 0.0)
            return perm
        self.counts["certified"] += 1
        arcs, v, rounds = proof
        moves = tuple(m for m in (10 * moved, moved, moved / 10) if m <= MAX_RADIUS) or RADII
        cap = min(RADIUS_ROUNDS, 2 * rounds + 4)
        radius = next((within(m) for m in moves if potentials(arcs, v, 2 * within(m), cap) is not None), 0.0)
        slack = FLOAT_SLACK * max(1.0, float(s.abs().max()))  # float32 errors grow with the entries
        self.states[layer] = _State(state.perm, v, rounds, reference.detach().clone(), radius, slack)
        return state.perm
