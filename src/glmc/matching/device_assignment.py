"""Linear assignment on the device that holds the problem: an ε-scaling auction (Bertsekas 1988) whose
answers are certified optimal, batched over many problems of one size.

auction_assignment(S) maximises sum_i S[i, perm[i]] for every square (n, n) matrix of a (..., n, n)
batch, in torch, where S lives (CPU or CUDA), in float64 whatever S's dtype (float32 entries are
copied exactly):

* **bidding** (Jacobi): every unassigned row of every problem bids at once for its best column j at
  price p_j + (best - second best value) + ε; each column goes to its highest bidder (scatter_reduce)
  and its previous owner becomes unassigned. The assignment keeps ε-complementary slackness
  S[i, perm[i]] - p[perm[i]] >= max_j (S[i, j] - p[j]) - ε. ε starts at a quarter of a problem's range
  and falls by THETA each phase; a phase releases only the rows that break the new ε's slackness;
* **certificate**: once ε is small, the prices are raised by longest-path relaxation (as
  glmc.matching.warm_assignment does for a kept permutation) into potentials v with
  S[i, j] - v[j] <= S[i, perm[i]] - v[perm[i]] + tie for every i, j: the row duals u_i = max_j (S[i, j]
  - v[j]) then meet complementary slackness on the assignment, which is optimal to within n float64
  ties. Integer-valued problems are proved optimal instead by a duality gap below 1, which ε < 1/n
  gives. The certificate is tried after every phase (a few rounds only before ε is small, which
  settles ties, where every assignment is optimal, at once). A problem not certified by ε = FLOOR of
  its range (costs closer than float64 resolves, a bidding war too long) is solved by SciPy on the
  host, and the answer says which;
* **warm start**: the prices and permutation of an earlier answer (`prices`, `perm`) start the next
  call: a permutation the certificate still proves optimal costs no bidding, and otherwise ε starts
  near its worst slackness violation instead of the range, so a matrix that moved a little costs the
  rows that broke slackness and a few phases.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor

from glmc.symmetry import Permutation

# ε as a share of a problem's range (max - min entry): COLD at a cold start, divided by THETA per phase
COLD = 0.25
THETA = 8.0
# the certificate is tried in full once ε is below TARGET of the range (n times that bounds how far the
# assignment may be from optimal, so most are optimal there) or a phase gave every row its column back,
# and in QUICK_ROUNDS after the other phases; bidding stops at FLOOR of the range or of the largest
# |entry|, below which float64 prices no longer resolve ε
TARGET = 1e-10
FLOOR = 1e-14
# an arc better than the assignment by at most TIE of the range (warm_assignment.TIE, made relative),
# plus ROUNDING of the largest |entry| (float64 sums of such entries are exact to a few 1e-16 of it),
# does not refute it
TIE = 1e-12
ROUNDING = 1e-14
# relaxation rounds per certificate: from the auction's prices an optimal assignment took under 30
# (n = 1,024); from an earlier answer's potentials, after the matrix moved, under 50
RELAX_ROUNDS = 32
WARM_ROUNDS = 64
QUICK_ROUNDS = 4
# a warm start's first ε, as a share of its worst slackness violation: the rows that broke it most bid
# first, with increments that keep most prices (a tenth took fewer rounds than a half or a hundredth on
# random and near-permutation matrices moved by 1e-3 to 1e-2 of their range, n = 64 to 1,024)
WARM_SCALE = 0.1


@dataclass
class Assignment:
    """perm (..., n) int64: row i takes column perm[i]; prices (..., n) float64: the column potentials
    that certified it (the auction's prices where the certificate was the gap, or SciPy solved it),
    least 0, to start the next call; fallback: the problems (flat batch indices) SciPy solved; rounds: bidding
    rounds (all problems bid in the same rounds); relax_rounds: the certificates' relaxation rounds."""

    perm: Tensor
    prices: Tensor
    fallback: tuple[int, ...]
    rounds: int
    relax_rounds: int


def _checked(similarity: Tensor) -> Tensor:
    """The problems as one (B, n, n) float64 tensor; ValueError for other shapes and non-finite entries,
    naming the first problem that holds one."""
    shape = tuple(similarity.shape)
    if len(shape) < 2 or shape[-1] != shape[-2]:
        raise ValueError(f"the device assignment solves square (..., n, n) problems, got shape {shape}")
    n = shape[-1]
    s = similarity.detach().reshape(math.prod(shape[:-2]), n, n).to(torch.float64)
    bad = ~torch.isfinite(s).flatten(1).all(1) if n else torch.zeros(len(s), dtype=torch.bool)
    if bool(bad.any()):
        first, batch = int(bad.nonzero()[0]), shape[:-2]
        if len(batch) == 1:
            name = f"problem {first} of {batch[0]}"
        else:
            where = tuple(int(i) for i in np.unravel_index(first, batch))
            name = f"problem {where} of batch {batch}" if batch else "the problem"
        raise ValueError(f"{name} has NaN or infinite entries: no assignment is optimal for it")
    return s


class _Auction:
    """Bidding state of B problems of size n: prices, row -> column and column -> row (-1: none), flat,
    with one scratch slot at the end where masked-out writes go (no data-dependent shapes, so no
    host synchronisation beyond one per round)."""

    def __init__(self, s: Tensor, prices: Tensor | None, perm: Tensor | None):
        b, n = s.shape[0], s.shape[1]
        self.s, self.n, self.scratch = s, n, b * n
        self.rows = s.reshape(b * n, n)
        flat = s.flatten(1)
        span, self.size = flat.amax(1) - flat.amin(1), flat.abs().amax(1)
        self.unit = torch.where(span > 0, span, self.size.clamp_min(1.0))  # ε of a constant problem too
        self.tie = TIE * self.unit + ROUNDING * self.size
        self.least = FLOOR * torch.maximum(self.unit, self.size)  # the smallest ε bid with
        self.integral = (flat == flat.round()).all(1) & (self.size < 2.0**40)
        device = s.device
        self.flat_p = torch.zeros(b * n + 1, dtype=torch.float64, device=device)
        self.flat_rows = torch.full((b * n + 1,), -1, dtype=torch.long, device=device)
        self.flat_cols = torch.full((b * n + 1,), -1, dtype=torch.long, device=device)
        self.base = torch.arange(b, device=device) * n
        self.active = torch.ones(b, dtype=torch.bool, device=device)  # problems still bidding
        self.warm = torch.zeros(b, dtype=torch.bool, device=device)
        if prices is not None:
            given = prices.detach().reshape(b, n).to(device=device, dtype=torch.float64)
            given = torch.where(given.isfinite(), given, 0.0)
            # prices spread over more than twice the range would cost bidding rounds to even out (an
            # earlier answer's spread over less), and only their differences count
            self.p.copy_(torch.minimum(given - given.amin(1, keepdim=True), 2 * self.unit[:, None]))
        if perm is not None:
            perm = perm.detach().reshape(b, n).to(device=device, dtype=torch.long)
            # a row of the batch that is no permutation (-1s: none known) starts cold
            self.warm = (perm.sort(1).values == torch.arange(n, device=device)).all(1)
            rows = torch.where(self.warm[:, None], perm, -1)
            self.row_col.copy_(rows)
            columns = torch.where(self.warm[:, None], self.base[:, None] + perm, self.scratch)
            self.flat_cols[columns.reshape(-1)] = torch.arange(n, device=device).repeat(b)

    @property
    def p(self) -> Tensor:
        return self.flat_p[: self.scratch].view(-1, self.n)

    @property
    def row_col(self) -> Tensor:
        return self.flat_rows[: self.scratch].view(-1, self.n)

    def release(self, eps: Tensor) -> None:
        """Unassigns the rows whose assignment breaks ε-complementary slackness at the prices."""
        value = self.s - self.p[:, None, :]
        rows = self.row_col
        own = value.gather(2, rows.clamp_min(0)[..., None]).squeeze(2)
        bad = (rows >= 0) & (own < value.amax(2) - eps[:, None]) & self.active[:, None]
        at = self.base[:, None] + torch.arange(self.n, device=rows.device)
        self.flat_cols[torch.where(bad, self.base[:, None] + rows, self.scratch).reshape(-1)] = -1
        self.flat_rows[torch.where(bad, at, self.scratch).reshape(-1)] = -1

    def bid(self, eps: Tensor) -> bool:
        """One round: every unassigned row of an active problem bids for its best column, each column
        goes to its highest bid (the highest row index among equal ones). False where none was free.
        Rows are numbered b * n + i across the batch; flat_cols holds a problem's own row index."""
        free = ((self.flat_rows[: self.scratch] < 0) & self.bidding).nonzero().squeeze(1)
        if not len(free):
            return False
        b = free.div(self.n, rounding_mode="floor")
        base = b * self.n
        top = (self.rows.index_select(0, free) - self.p.index_select(0, b)).topk(2, dim=1)
        j = top.indices[:, 0]
        key = base + j
        offer = self.flat_p.index_select(0, key) + (top.values[:, 0] - top.values[:, 1]) + eps.index_select(0, b)
        best = torch.full_like(self.flat_p, -math.inf).scatter_reduce_(0, key, offer, "amax")
        candidate = torch.where(offer == best.index_select(0, key), free, -1)
        winner = torch.full_like(self.flat_cols, -1).scatter_reduce_(0, key, candidate, "amax")
        won = winner.index_select(0, key) == free
        slot = torch.where(won, key, self.scratch)  # losers write to the scratch slot
        old = self.flat_cols.index_select(0, slot)
        self.flat_rows.index_fill_(0, torch.where(won & (old >= 0), base + old, self.scratch), -1)
        self.flat_cols.index_copy_(0, slot, free - base)
        self.flat_rows.index_copy_(0, torch.where(won, free, self.scratch), j)
        self.flat_p.index_copy_(0, slot, offer)
        return True

    def phase(self, eps: Tensor, cap: int) -> tuple[int, Tensor]:
        """Bidding rounds at ε until every active problem is assigned (at most `cap`; the problems left
        unassigned then stop bidding). Returns the rounds, and per problem whether rows were released
        and all took their columns back (a hint that the assignment is optimal)."""
        before = self.row_col.clone()
        self.bidding = self.active.repeat_interleave(self.n)
        self.release(eps)
        released = (self.row_col < 0).any(1)
        rounds = cap
        for done in range(cap):
            if not self.bid(eps):
                rounds = done
                break
        if rounds == cap:
            self.active &= ~(self.row_col < 0).any(1)
        return rounds, released & (self.row_col == before).all(1)


def _slackness(s: Tensor, v: Tensor, perm: Tensor) -> tuple[Tensor, Tensor]:
    """(u, own): the row duals max_j (S[i, j] - v[j]) and each row's S[i, perm[i]] - v[perm[i]]."""
    own = s.gather(2, perm[..., None]).squeeze(2) - v.gather(1, perm)
    return (s - v[:, None, :]).amax(2), own


def relax_prices(s: Tensor, p: Tensor, perm: Tensor, tie: Tensor, rounds: int) -> tuple[Tensor, Tensor, int]:
    """(certified, v, rounds): potentials v >= p raised by longest-path relaxation until
    S[i, j] - v[j] <= S[i, perm[i]] - v[perm[i]] + tie (a round sets v[j] to the most any row r asks
    of it, S[r, j] - (S[r, perm[r]] - v[perm[r]])); certified per problem where the potentials satisfy
    that to within 2 tie, which proves perm optimal to within 2 n tie."""
    v, own_s = p.clone(), s.gather(2, perm[..., None]).squeeze(2)
    done = 0
    while done < rounds:
        done += 1
        profit = own_s - v.gather(1, perm)
        raised = torch.maximum(v, (s - profit[:, :, None]).amax(1) - tie[:, None])
        rose = bool((raised > v).any())
        v = raised
        if not rose:
            break
    u, own = _slackness(s, v, perm)
    return (u <= own + 2 * tie[:, None]).all(1), v, done


def _gap_certified(s: Tensor, p: Tensor, perm: Tensor, size: Tensor) -> Tensor:
    """Per problem of integer entries: whether the duality gap sum u + sum p - sum S[i, perm[i]] lies
    below 1 less its float64 rounding, which proves perm optimal (another assignment gains an integer)."""
    u, own = _slackness(s, p, perm)
    gap = u.sum(1) - own.sum(1)  # sum_i (u_i - S[i, perm i] + p[perm i]): perm covers every column
    return gap < 1.0 - 1e-14 * s.shape[1] * (size + p.abs().amax(1) + 1.0)


def _select(t: Tensor, idx: Tensor) -> Tensor:
    return t if len(idx) == len(t) else t.index_select(0, idx)  # (all of a large problem: no copy)


def _certify(auction: _Auction, which: Tensor, done: Tensor, cap: int = RELAX_ROUNDS) -> int:
    """Certifies the problems in `which` (all assigned): by the gap where their entries are integers,
    else (or where the gap is too wide) by relaxed prices, which replace the auction's where they
    certify. Marks `done`; returns the relaxation rounds."""
    gap = (which & auction.integral).nonzero().squeeze(1)
    if len(gap):
        s, p, perm = (_select(t, gap) for t in (auction.s, auction.p, auction.row_col))
        done[gap] = _gap_certified(s, p, perm, auction.size[gap])
    idx = (which & ~done).nonzero().squeeze(1)
    if not len(idx):
        return 0
    s, p, perm = (_select(t, idx) for t in (auction.s, auction.p, auction.row_col))
    ok, v, rounds = relax_prices(s, p, perm, auction.tie[idx], cap)
    auction.p[idx] = torch.where(ok[:, None], v, p)
    done[idx] = ok
    return rounds


def _scipy(s: Tensor, b: int) -> Tensor:
    """The assignment of problem b by SciPy's solver on the host, on s's device."""
    _, cols = linear_sum_assignment(s[b].cpu().numpy(), maximize=True)
    return torch.as_tensor(cols, dtype=torch.long, device=s.device)


def _start(auction: _Auction, done: Tensor) -> tuple[Tensor, int]:
    """The first ε of each problem (as a share of its range) and the relaxation rounds spent: warm
    permutations the certificate still proves optimal are done, the others start at WARM_SCALE of their
    worst slackness violation (the first phase releases the rows that break it most), cold ones at COLD."""
    rel = torch.full_like(auction.unit, COLD)
    if not bool(auction.warm.any()):
        return rel, 0
    rounds = _certify(auction, auction.warm, done, WARM_ROUNDS)
    u, own = _slackness(auction.s, auction.p, auction.row_col.clamp_min(0))
    violation = (u - own).amax(1) / auction.unit
    lowest = (auction.least / auction.unit).clamp_min(TARGET)  # (a violation within ties bids once)
    warm = torch.maximum(torch.where(violation.isfinite(), violation * WARM_SCALE, COLD).clamp_max(COLD), lowest)
    return torch.where(auction.warm, warm, rel), rounds


def _trivial(s: Tensor, batch: tuple[int, ...], n: int) -> Assignment:
    """Problems of size 0 or 1: nothing to choose."""
    perm = torch.zeros(*batch, n, dtype=torch.long, device=s.device)
    return Assignment(perm, torch.zeros(*batch, n, dtype=torch.float64, device=s.device), (), 0, 0)


def auction_assignment(similarity: Tensor, prices: Tensor | None = None, perm: Tensor | None = None) -> Assignment:
    """The permutations maximising sum_i S[i, perm[i]] for each (n, n) problem of a (..., n, n) tensor,
    computed on its device and certified optimal (to within float64 ties), SciPy deciding the problems
    the certificate leaves open. `prices` (..., n) and `perm` (..., n) from an earlier Assignment start
    the auction there (a row of perm that is no permutation, such as -1s, starts that problem cold)."""
    s = _checked(similarity)
    batch, n = tuple(similarity.shape[:-2]), s.shape[-1]
    if n < 2:
        return _trivial(s, batch, n)
    auction = _Auction(s, prices, perm)
    done = torch.zeros(len(s), dtype=torch.bool, device=s.device)
    rel, relaxed = _start(auction, done)
    rounds, cap = 0, 50 * n + 1000
    while True:
        auction.active &= ~done & (auction.unit * rel >= auction.least)  # certified ones keep their potentials
        if not bool(auction.active.any()):
            break
        eps = auction.unit * rel
        spent, kept = auction.phase(eps, cap)
        rounds += spent
        ready = auction.active & (kept | (rel <= TARGET) | (auction.integral & (eps < 0.5 / n)))  # (n ε < 1)
        relaxed += _certify(auction, ready, done)
        # a few rounds for the rest: ties (all assignments optimal) certify at once, at any ε
        relaxed += _certify(auction, auction.active & ~ready & ~done, done, QUICK_ROUNDS)
        rel = torch.where(done, rel, rel / THETA)
    row_col = auction.row_col.clone()
    fallback = tuple(int(b) for b in (~done).nonzero().squeeze(1).tolist())
    for b in fallback:
        row_col[b] = _scipy(s, b)
    prices = auction.p - auction.p.amin(1, keepdim=True)  # (potentials are defined up to a constant)
    return Assignment(row_col.reshape(*batch, n), prices.reshape(*batch, n), fallback, rounds, relaxed)


class DeviceAssignments:
    """The last answer per key (a latent's name), started from by the next solve of that key; problems
    of one size on one device are solved as one batch. `counts`: problems solved, those SciPy decided
    (fallback), and bidding rounds, over all calls."""

    def __init__(self) -> None:
        self.states: dict[object, tuple[Tensor, Tensor]] = {}
        self.counts = {"solved": 0, "fallback": 0, "rounds": 0}

    def remember(self, key: object, perm: Permutation) -> None:
        """An assignment found otherwise: the rows' maxima in distinct columns, proved optimal by zero
        prices (every row takes its largest entry)."""
        p = perm.perm
        self.states[key] = (torch.zeros(p.shape, dtype=torch.float64, device=p.device), p)

    def project(self, problems: dict[object, Tensor]) -> dict[object, Permutation]:
        """The optimal assignment of every (n, n) matrix in `problems`, by key."""
        groups: dict[tuple, list] = {}
        for key, z in problems.items():
            groups.setdefault((tuple(z.shape), z.device), []).append(key)
        out = {}
        for (shape, device), keys in groups.items():
            s = torch.stack([problems[k].detach() for k in keys])
            cold = (torch.zeros(shape[-1], dtype=torch.float64), torch.full((shape[-1],), -1, dtype=torch.long))
            states = [self.states.get(k, cold) for k in keys]
            prices = torch.stack([state[0].to(device) for state in states])
            perm = torch.stack([state[1].to(device) for state in states])
            found = auction_assignment(s, prices, perm)
            self.counts["solved"] += len(keys)
            self.counts["fallback"] += len(found.fallback)
            self.counts["rounds"] += found.rounds
            for i, key in enumerate(keys):
                self.states[key] = (found.prices[i], found.perm[i])
                out[key] = Permutation(found.perm[i])
        return out
