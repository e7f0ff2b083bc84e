"""Linear assignment on the device that holds the problem: an ε-scaling auction (Bertsekas 1988) whose
answers are certified optimal, batched over many problems of one size, in float64.

Bidding: every unassigned row bids at once for its best column at price p_j + (best - second) + ε,
keeping ε-complementary slackness; ε starts at COLD of a problem's range and falls by THETA per phase.
Certificate: longest-path relaxation raises the prices into potentials under which the assignment meets
complementary slackness to within float64 ties (integer problems: a duality gap below 1). Problems not
certified by ε = FLOOR of their range go to SciPy on the host. Warm start: an earlier answer's prices and
permutation start the next call, so a matrix that moved a little costs only the rows that broke slackness.
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
# the full certificate once ε is below TARGET of the range; bidding stops at FLOOR (float64's resolution)
TARGET = 1e-10
FLOOR = 1e-14
# an arc better than the assignment by at most TIE of the range plus ROUNDING of the largest |entry|
# does not refute it
TIE = 1e-12
ROUNDING = 1e-14
# relaxation rounds per certificate (measured: under 30 from the auction's prices, under 50 warm)
RELAX_ROUNDS = 32
WARM_ROUNDS = 64
QUICK_ROUNDS = 4
# a warm start's first ε as a share of its worst slackness violation (a tenth took the fewest rounds)
WARM_SCALE = 0.1


@dataclass
class Assignment:
    """perm (..., n): row i takes column perm[i]; prices (..., n) float64, least 0: the potentials that
    certified it, to start the next call; fallback: the flat batch indices SciPy solved; rounds, relax_rounds:
    bidding and relaxation rounds."""

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
    with a scratch slot at the end for masked-out writes (no data-dependent shapes)."""

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
            # only differences count; a spread over twice the range would cost rounds to even out
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
        """One round: every unassigned row (numbered b * n + i) bids for its best column, which goes to its
        highest bid (the highest row among equal ones). False where no row was free."""
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
        """Bidding rounds at ε until every active problem is assigned (at most `cap`, then the unassigned stop).
        Returns the rounds and per problem whether released rows all took their columns back."""
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
    S[i, j] - v[j] <= S[i, perm[i]] - v[perm[i]] + tie; certified per problem where that holds to 2 tie."""
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
    """The first ε of each problem (a share of its range) and the relaxation rounds spent: certified warm
    starts are done, other warm ones start at WARM_SCALE of their worst violation, cold ones at COLD."""
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
    """The permutations maximising sum_i S[i, perm[i]] for each (n, n) problem of a (..., n, n) tensor, on
    its device, certified optimal (SciPy deciding the rest). `prices`, `perm` from an earlier Assignment
    start the auction there (a perm row that is no permutation starts cold)."""
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
    """The last answer per key, started from by that key's next solve; problems of one size and device are
    solved as one batch. `counts`: problems solved, SciPy fallbacks and bidding rounds over all calls."""

    def __init__(self) -> None:
        self.states: dict[object, tuple[Tensor, Tensor]] = {}
        self.counts = {"solved": 0, "fallback": 0, "rounds": 0}

    def remember(self, key: object, perm: Permutation) -> None:
        """An assignment of the rows' distinct maxima, proved optimal by zero prices."""
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


# where weight matching's fresh assignments go to the auction: nowhere by default. A fresh dense problem
# costs the auction far more than a host copy and SciPy (3,072 units: 8.9 s against 0.67 s on a CPU), and
# with it GPT-2's weight matching on an H100 did not finish its first iteration in 200 s; the warm-started
# batches of learned matching (matcher.learned.assignment) are where it wins
DEVICE_SOLVER_TYPES: tuple[str, ...] = ()
DEVICE_UNITS = 512


def solves_on_device(similarity: Tensor) -> bool:
    """Whether a square problem of this size on this device is solved by the auction there."""
    shape = similarity.shape
    return (
        similarity.device.type in DEVICE_SOLVER_TYPES and similarity.dim() == 2 and shape[0] == shape[1] >= DEVICE_UNITS
    )


def device_project(similarity: Tensor) -> Permutation:
    """Permutation.project on the similarity's device where that wins (solves_on_device): the rows'
    distinct maxima, else the certified auction, SciPy deciding what it does not certify."""
    if not solves_on_device(similarity):
        return Permutation.project(similarity)
    shortcut = Permutation.from_row_maxima(similarity.detach())
    return shortcut if shortcut is not None else Permutation(auction_assignment(similarity).perm)
