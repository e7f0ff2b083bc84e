"""weight_refined: weight matching whose residual map is refined without data (beyond papers 001-003).

Paper 001 §6 finds learned matching keeps weight matching's unit permutations and corrects its residual
map by small angles; this matcher seeks that correction from the weights alone, minimising over R (the
unit permutations re-solved in between)

    J(R, P) = ||theta_A - T(theta_B)||^2 / ||theta_A||^2  +  proxy_weight * proxy(R, P)

The proxy stands in for the midpoint's loss using the residual stream's second moments propagated in a
Gaussian approximation (Moments, stream_gains): "gain" (default), mean_r (log rho_r)^2 over readers of
the midpoint's gain against the endpoints' mean; "stream", each reader's and writer's distance weighted
by A's moments (stream_errors). Starts: weight matching's solution, weight_perm's and `starts` random
maps; each alternates assignments (kept where J falls) with Riemannian steps (polar retraction, Armijo
backtracking), so the result is never worse than weight matching's by J. Families without a pre-norm
circuit form, orthogonal residual and plain permutations get weight matching's alignment and the reason.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from glmc.alignment import Alignment
from glmc.interpolation import merge_params
from glmc.matching.base import MatchContext, Matcher, circuit_pairs, require_factored
from glmc.matching.engine.circuits import circuit_factors, head_inner_diag, head_similarity
from glmc.matching.engine.mlp_units import mlp_similarity
from glmc.matching.engine.residual_map import eigen_angles
from glmc.matching.latent_apply import LatentApplier
from glmc.matching.weight import used_tokens, weight_matching
from glmc.models.blocks import full
from glmc.models.canonical import CanonicalTransformer
from glmc.models.families import family_named
from glmc.models.families.base import residual_axis
from glmc.models.families.roles import HEAD_HIDDEN, in_head_pair, layer_of, pair_factors
from glmc.ranges import check_settings
from glmc.settings.methods import WeightRefinedMatcherConfig
from glmc.symmetry import Orthogonal, Permutation, SymmetrySpec, Transform, apply, apply_params
from glmc.symmetry.family_defaults import resolve_residual

Params = dict[str, Tensor]


def unsupported(model: CanonicalTransformer, residual: str) -> str | None:
    """Why the refinement cannot run on `model` (None when it can)."""
    family = family_named(model.config.family)
    spec = SymmetrySpec.from_model(model)
    # a gated MLP's signed up/down scales (a ReLU model's positive unit scales are left at one here)
    spaces = {s.kind for s in spec if s.kind != "mlp_scale" or "diagonal" in s.classes}
    if residual != "orthogonal":
        return f"the residual map is {residual}, not orthogonal"
    if not family.circuit_form or family.attention_kind == "grouped":
        return f"family {model.config.family} has grouped or rotary heads (no circuit form)"
    if spaces & {"qheads", "mlp_scale"} or HEAD_HIDDEN in spec.spaces:
        return f"family {model.config.family} has gated MLPs or a head with a hidden state"
    if model.config.parallel_residual:
        return "attention and MLP read the same stream (parallel residual)"
    return None


# -- the objective's parts, differentiable in the parameters ------------------------------------------


def circuit_distance(pa: Params, pb: Params, layers: range) -> Tensor:
    """||theta_A - theta_B||^2 over circuit-form parameters, heads compared in place (weight
    matching's objective, before its normalisation), as a tensor in the graph."""
    total = sum(((a - pb[n]) ** 2).sum() for n, a in pa.items() if not in_head_pair(n))
    for layer in layers:
        for (xa, ya), (xb, yb) in zip(circuit_factors(pa, layer), circuit_factors(pb, layer)):
            aa, bb = head_inner_diag(xa, ya, xa, ya).sum(), head_inner_diag(xb, yb, xb, yb).sum()
            total = total + aa + bb - 2 * head_inner_diag(xa, ya, xb, yb).sum()
    return total


class Distance:
    """circuit_distance(pa, T(theta_B)) for a fixed A and transforms T that keep every tensor's and
    every circuit's norm (orthogonal maps, permutations): ||A||^2 + ||B||^2 - 2 <A, T(B)>, A's side of the
    inner product laid out once (the plain tensors as one vector, the circuits' factors per layer)."""

    def __init__(self, pa: Params, pb: Params, layers: range):
        self.names = [n for n in pa if not in_head_pair(n)]
        self.flat = torch.cat([pa[n].reshape(-1) for n in self.names])
        self.layers = layers
        self.circuits = {layer: circuit_factors(pa, layer) for layer in layers}
        zeros = {k: torch.zeros_like(v) for k, v in pa.items()}
        self.constant = float(circuit_distance(pa, zeros, layers) + circuit_distance(pb, zeros, layers))

    def __call__(self, pb: Params) -> Tensor:
        inner = self.flat @ torch.cat([pb[n].reshape(-1) for n in self.names])
        for layer, factors in self.circuits.items():
            for (xa, ya), (xb, yb) in zip(factors, circuit_factors(pb, layer)):
                inner = inner + head_inner_diag(xa, ya, xb, yb).sum()
        return self.constant - 2 * inner


def _normalised(s: Tensor) -> Tensor:
    """The second moment of the RMS-normalised stream with the constant coordinate the circuits'
    bias columns read appended: blockdiag(S * D / tr S, 1)."""
    d = s.shape[0]
    out = torch.zeros(d + 1, d + 1, dtype=s.dtype, device=s.device)
    out[:d, :d] = s * (d / s.diagonal().sum().clamp_min(1e-30))
    out[d, d] = 1.0
    return out


@dataclass(frozen=True)
class Stream:
    """Where the residual stream is written and read outside the layers: (name, residual axis, whether
    the tensor is a table of alternatives (token or position rows), averaged over its rows)."""

    writers: tuple[tuple[str, int, bool], ...]
    readers: tuple[tuple[str, int], ...]
    layers: range

    @classmethod
    def of(cls, model: CanonicalTransformer) -> Stream:
        layout = family_named(model.config.family).layout(model.config)
        writers, readers = [], []
        for name, t in model.params().items():
            if layer_of(name) is not None:
                continue
            out, into = residual_axis(layout, name, "out"), residual_axis(layout, name, "in")
            if out is not None:
                writers.append((name, out, t.dim() == 2 and out == 1))
            elif into is not None:
                readers.append((name, into))
        return cls(tuple(writers), tuple(readers), range(model.num_layers))


def _embedding_moment(p: Params, stream: Stream) -> Tensor:
    """The stream's second moment right after the embeddings: every writer's columns' outer products,
    a table's averaged over its rows (one token, one position at a time)."""
    s = 0.0
    for name, axis, table in stream.writers:
        x = p[name].movedim(axis, 0)
        x = x.reshape(x.shape[0], -1)
        s = s + x @ x.T / (x.shape[1] if table else 1)
    return s


def _attention(p: Params, layer: int, n: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """One attention block on a stream of normalised moment n: the QK gain sum_h ||n^1/2 QK_h n^1/2||^2,
    the OV gain sum_h tr(OV_h n OV_h^T) and the moment it writes into the stream."""
    (q, k), (v, o) = pair_factors(p, layer, "qk", full.ROLES), pair_factors(p, layer, "vo", full.ROLES)
    qk = ((q @ n @ q.mT) * (k @ n @ k.mT)).sum()
    vnv = v @ n @ v.mT  # (H, d, d); OV_h = o_h^T v_h
    written = torch.einsum("hdi,hde,hej->ij", o, vnv, o)
    bias = p[f"blocks.{layer}.o_b"]
    return qk, (vnv * (o @ o.mT)).sum(), written + torch.outer(bias, bias)


def _mlp_rows(p: Params, layer: int) -> Tensor:
    pre = f"blocks.{layer}."
    return torch.cat([p[pre + "in_w"], p[pre + "in_b"][:, None]], 1)


def _mlp(p: Params, layer: int, n: Tensor) -> tuple[Tensor, Tensor]:
    """One MLP on a stream of normalised moment n: its units' input variances and the moment it writes
    (each output column weighted by half its unit's input variance, as a ReLU of a Gaussian)."""
    pre, rows = f"blocks.{layer}.", _mlp_rows(p, layer)
    variance = ((rows @ n) * rows).sum(1)
    out = p[pre + "out_w"]
    written = (out * (variance / 2)) @ out.T + torch.outer(p[pre + "out_b"], p[pre + "out_b"])
    return variance, written


def stream_gains(p: Params, stream: Stream) -> Tensor:
    """Per reader, in order (per layer QK, OV, MLP input; then the readers outside the layers), the
    energy it reads from the normalised stream, the stream's moment propagated from the embeddings
    through every block (module docstring)."""
    s = _embedding_moment(p, stream)
    gains = []
    for layer in stream.layers:
        qk, ov, written = _attention(p, layer, _normalised(s))
        s = s + written
        mlp, written = _mlp(p, layer, _normalised(s))
        s = s + written
        gains += [qk, ov, mlp.sum()]
    n = _normalised(s)[:-1, :-1]
    for name, axis in stream.readers:
        w = p[name].movedim(axis, -1)
        w = w.reshape(-1, w.shape[-1])
        gains.append(((w @ n) * w).sum())
    return torch.stack(gains)


@dataclass
class Moments:
    """A's stream as its readers see it (stream_gains' propagation): per layer the normalised moment the
    attention and the MLP read and the MLP units' input variances, and the moment the final readers read."""

    attention: list[Tensor]
    mlp: list[Tensor]
    variance: list[Tensor]
    final: Tensor

    @classmethod
    def of(cls, p: Params, stream: Stream) -> Moments:
        s, out = _embedding_moment(p, stream), cls([], [], [], torch.empty(0))
        for layer in stream.layers:
            out.attention.append(_normalised(s))
            s = s + _attention(p, layer, out.attention[-1])[2]
            out.mlp.append(_normalised(s))
            variance, written = _mlp(p, layer, out.mlp[-1])
            out.variance.append(variance)
            s = s + written
        out.final = _normalised(s)[:-1, :-1]
        return out


def _pair_error(pa: Params, pb: Params, layer: int, n: Tensor) -> tuple[Tensor, Tensor]:
    """sum_h ||n^1/2 (QK_A,h - QK_B,h) n^1/2||^2 and sum_h ||(OV_A,h - OV_B,h) n^1/2||^2, from the
    factors (d x d products per head, no circuit built)."""
    (qa, ka), (va, oa) = (pair_factors(pa, layer, pair, full.ROLES) for pair in ("qk", "vo"))
    (qb, kb), (vb, ob) = (pair_factors(pb, layer, pair, full.ROLES) for pair in ("qk", "vo"))
    qk = lambda x, y: ((x[0] @ n @ y[0].mT) * (x[1] @ n @ y[1].mT)).sum()  # noqa: E731
    ov = lambda x, y: ((x[0] @ n @ y[0].mT) * (x[1] @ y[1].mT)).sum()  # noqa: E731
    errors = []
    for inner, a, b in ((qk, (qa, ka), (qb, kb)), (ov, (va, oa), (vb, ob))):
        errors.append(inner(a, a) + inner(b, b) - 2 * inner(a, b))
    return errors[0], errors[1]


def stream_errors(pa: Params, pb: Params, moments: Moments, stream: Stream) -> Tensor:
    """Per reader and writer, how far B's differs from A's on the stream A's moments describe: per layer
    the QK and OV circuits and the MLP's input rows on the moments they read, its output columns
    weighted by A's units' variances; then the readers outside the layers on the final moment."""
    errors = []
    for layer in stream.layers:
        errors += _pair_error(pa, pb, layer, moments.attention[layer])
        rows = _mlp_rows(pa, layer) - _mlp_rows(pb, layer)
        errors.append(((rows @ moments.mlp[layer]) * rows).sum())
        out = pa[f"blocks.{layer}.out_w"] - pb[f"blocks.{layer}.out_w"]
        errors.append((out.pow(2).sum(0) * moments.variance[layer]).sum() / 2)
    for name, axis in stream.readers:
        w = (pa[name] - pb[name]).movedim(axis, -1)
        w = w.reshape(-1, w.shape[-1])
        errors.append(((w @ moments.final) * w).sum())
    return torch.stack(errors)


# -- the search ---------------------------------------------------------------------------------------


@dataclass
class Problem:
    """What the refinement compares, fixed for its run: A's and B's parameters in float64 (the token rows
    of the vocabulary restricted as weight matching restricts them), B's symmetry spaces, where the
    stream is written and read, and the constants of J."""

    pa: Params
    pb: Params
    spec: SymmetrySpec
    stream: Stream
    circuits: tuple[str, ...]
    norm: float  # ||theta_A||^2 over circuit-form parameters
    distance: Distance
    proxy: str  # "stream" (stream_errors) or "gain" (stream_gains)
    ends: Tensor  # "gain": the mean of A's and B's stream_gains; "stream": A's stream_errors against zero
    moments: Moments
    proxy_weight: float
    units: tuple[str, ...]  # the unit spaces re-assigned: "heads", "mlp"

    @classmethod
    def build(
        cls, a: CanonicalTransformer, b: CanonicalTransformer, tokens: Tensor | None, circuits, proxy: tuple, units
    ) -> Problem:
        """`proxy`: (its kind, its weight)."""
        layout = family_named(b.config.family).layout(b.config)

        def params(model: CanonicalTransformer) -> Params:
            p = {k: v.detach().double() for k, v in model.params().items()}
            if tokens is not None:  # untrained vocabulary rows are noise (weight matching leaves them out too)
                rows = [n for n in p if layer_of(n) is None and getattr(layout.get(n), "vocab_rows", False)]
                p.update({n: p[n][tokens] for n in rows})
            return p

        pa, pb, stream = params(a), params(b), Stream.of(b)
        zeros = {k: torch.zeros_like(v) for k, v in pa.items()}
        norm = float(circuit_distance(pa, zeros, stream.layers))
        moments, (kind, weight) = Moments.of(pa, stream), proxy
        if kind == "gain":
            ends = (stream_gains(pa, stream) + stream_gains(pb, stream)) / 2
        else:
            ends = stream_errors(pa, zeros, moments, stream).clamp_min(1e-30)
        spec, distance = SymmetrySpec.from_model(b), Distance(pa, pb, stream.layers)
        circuits, units = tuple(circuits), tuple(units)
        return cls(pa, pb, spec, stream, circuits, norm, distance, kind, ends, moments, float(weight), units)

    def assignments(self, r: Tensor) -> Transform:
        """Weight matching's head and MLP assignments at residual map r."""
        pb_res = apply_params(Transform({"residual": Orthogonal(r)}), self.spec, self.pb)
        out = Transform()
        for layer in self.stream.layers:
            if "heads" in self.units:
                out[f"heads.{layer}"] = Permutation.project(head_similarity(self.pa, pb_res, layer))
            if "mlp" in self.units:
                out[f"mlp.{layer}"] = Permutation.project(mlp_similarity(self.pa, pb_res, layer))
        return out


class Objective:
    """J(R) at fixed unit permutations: B's permuted tensors laid out once, R applied by one product."""

    def __init__(self, problem: Problem, perms: Transform):
        self.problem, self.perms = problem, Transform(perms)
        moved = apply_params(self.perms, problem.spec, problem.pb) if perms else dict(problem.pb)
        self.applier = LatentApplier(problem.spec, moved, ["residual"])

    def parts(self, r: Tensor) -> tuple[Tensor, Tensor]:
        """(relative squared distance, proxy) at residual map r, in the graph."""
        p = self.problem
        pb = self.applier({"residual": r})
        distance = p.distance(pb) / p.norm
        if p.proxy == "stream":
            return distance, (stream_errors(p.pa, pb, p.moments, p.stream) / p.ends).mean()
        mid = merge_params([p.pa, pb], [0.5, 0.5], p.circuits)
        return distance, (stream_gains(mid, p.stream) / p.ends).log().pow(2).mean()

    def __call__(self, r: Tensor) -> Tensor:
        distance, proxy = self.parts(r)
        return distance + self.problem.proxy_weight * proxy

    def report(self, r: Tensor) -> dict[str, float]:
        with torch.no_grad():
            distance, proxy = self.parts(r)
        value = float(distance + self.problem.proxy_weight * proxy)
        return {"objective": value, "distance": math.sqrt(max(float(distance), 0.0)), "proxy": float(proxy)}


def polar(m: Tensor) -> Tensor:
    return Orthogonal.project(m).matrix


# Armijo's sufficient decrease, the first step's angle (radians) and how often a step is halved
ARMIJO, FIRST_ANGLE, HALVINGS = 1e-4, 0.02, 12


def descend(objective: Objective, r: Tensor, value: float, steps: int, angle: list[float]) -> tuple[Tensor, float]:
    """Up to `steps` Riemannian gradient steps on J over the orthogonal group from r (polar retraction,
    backtracking from the last accepted angle, kept in `angle`); the first tries polar(-grad J), the
    Procrustes step of J's linearisation, before stepping. Returns the last accepted map and its J."""
    for step in range(steps):
        x = r.detach().requires_grad_()
        (grad,) = torch.autograd.grad(objective(x), x)
        if step == 0:
            jump = polar(-grad)
            with torch.no_grad():
                tried = float(objective(jump))
            if tried < value:
                r, value = jump, tried
                continue
        xi = 0.5 * (grad - r @ grad.T @ r)  # the Riemannian gradient R skew(R^T G), in ambient coordinates
        size = float(xi.norm())
        if size < 1e-12:
            break
        for _ in range(HALVINGS):
            candidate = polar(r - (angle[0] / size) * xi)
            with torch.no_grad():
                tried = float(objective(candidate))
            if tried <= value - ARMIJO * angle[0] * size:
                r, value = candidate, tried
                angle[0] = min(2 * angle[0], 1.0)
                break
            angle[0] *= 0.5
        else:
            break
    return r, value


@dataclass
class Found:
    """One start's result: its name, residual map, unit permutations and J."""

    start: str
    r: Tensor
    perms: Transform
    value: float


def search(problem: Problem, start: str, r: Tensor, perms: Transform, rounds: int, steps: int, tol: float) -> Found:
    """Alternates from (r, perms): the assignments at the current map where they lower J, then descend;
    stops after `rounds` or when a round improves J by at most tol * J."""
    objective = Objective(problem, perms)
    value, angle = float(objective(r).detach()), [FIRST_ANGLE]
    for _ in range(rounds):
        before = value
        solved = problem.assignments(r)
        if any(not torch.equal(g.perm, perms[n].perm) for n, g in solved.items()):
            trial = Objective(problem, solved)
            tried = float(trial(r).detach())
            if tried < value:
                objective, perms, value = trial, solved, tried
        r, value = descend(objective, r, value, steps, angle)
        if before - value <= tol * max(value, 1e-12):
            break
    return Found(start, r, perms, value)


def _units(t: Transform) -> Transform:
    return Transform({n: g for n, g in t.items() if n != "residual"})


def start_points(
    problem: Problem, weight: Transform, permuted: Transform | None, count: int, seed: int
) -> list[tuple[str, Tensor, Transform]]:
    """(name, residual map, unit permutations) of every start: weight matching's solution, the
    permuted residual's (weight_perm), then `count` random orthogonal maps with their assignments."""
    out = [("weight", weight["residual"].matrix.double(), _units(weight))]
    if permuted is not None:
        out.append(("weight_perm", permuted["residual"].dense(torch.float64), _units(permuted)))
    generator = torch.Generator().manual_seed(seed)
    width = out[0][1].shape[0]
    for i in range(count):
        r = Orthogonal.sample(width, generator, dtype=torch.float64).matrix
        out.append((f"random_{i}", r, problem.assignments(r)))
    return out


class WeightRefinedMatcher(Matcher):
    """`weight_refined`: weight matching, then its residual map refined without data (module docstring).

    The weight-matching settings are as `weight`'s; proxy, proxy_weight: the proxy and its weight in J;
    starts: extra random starts (seeded by seed); rounds per start, Riemannian steps per round."""

    def __init__(
        self,
        name: str = "weight_refined",
        residual: str = "auto",
        heads: str = "permutation",
        mlp: str = "permutation",
        qk: str = "circuit",
        vo: str = "circuit",
        max_iter: int = 15,
        tol: float = 1e-6,
        vocabulary: str = "train",
        proxy: str = "gain",
        proxy_weight: float = 0.1,
        starts: int = 1,
        rounds: int = 4,
        steps: int = 25,
        seed: int = 0,
    ):
        check_settings(WeightRefinedMatcherConfig, f"matcher.{name}", locals())  # the ranges glmc.settings declares
        self.name, self.residual, self.vocabulary = name, residual, vocabulary
        self.units = tuple(u for u, kind in (("heads", heads), ("mlp", mlp)) if kind != "none")
        self.circuits, self.max_iter, self.tol = circuit_pairs(qk, vo), max_iter, tol
        self.proxy, self.proxy_weight = proxy, proxy_weight
        self.starts, self.rounds, self.steps, self.seed = starts, rounds, steps, seed

    def weight(self, a: CanonicalTransformer, b: CanonicalTransformer, residual: str, tokens: Tensor | None):
        heads, mlp = "heads" in self.units, "mlp" in self.units
        # its unit re-assignments compare joined rows: the search it refines sets no unit scales either
        options = {"unit_scales": False}
        return weight_matching(a, b, residual, heads, mlp, self.max_iter, self.tol, tokens=tokens, options=options)

    def match(self, a: CanonicalTransformer, b: CanonicalTransformer, context: MatchContext | None = None) -> Alignment:
        require_factored(self.name, a, b)
        tokens = used_tokens(b, context) if self.vocabulary == "train" else None
        residual = resolve_residual(self.residual, family_named(a.config.family))[0]
        tick = time.perf_counter()
        start, wm = self.weight(a, b, residual, tokens)
        diagnostics: dict[str, Any] = {"weight_matching": _summary(wm), "seconds_weight": time.perf_counter() - tick}
        reason = unsupported(b, residual)
        if reason is not None:  # weight matching's own alignment, and why it was not refined
            diagnostics.update(refined=False, reason=reason)
            return Alignment(a, apply(start, b), start, self.circuits, diagnostics)
        tick = time.perf_counter()
        problem = Problem.build(a, b, tokens, self.circuits, (self.proxy, self.proxy_weight), self.units)
        permuted = self.weight(a, b, "permutation", tokens)[0]
        found = []
        for name, r, perms in start_points(problem, start, permuted, self.starts, self.seed):
            found.append(search(problem, name, r, perms, self.rounds, self.steps, self.tol))
        best = min(found, key=lambda f: f.value)
        transform = Transform({"residual": Orthogonal(best.r.float()), **best.perms})
        diagnostics.update(self.outcome(problem, start, found, best))
        diagnostics["seconds_refine"] = time.perf_counter() - tick
        return Alignment(a, apply(transform, b), transform, self.circuits, diagnostics)

    def outcome(self, problem: Problem, start: Transform, found: list[Found], best: Found) -> dict[str, Any]:
        """J and its parts at weight matching's solution and at the chosen one, every start's J, and the
        angles of the correction R_refined R_weight^T (paper 001 Fig. 5's measure of learned matching's)."""
        r0 = start["residual"].matrix.double()
        correction = best.r @ r0.T
        return {
            "refined": True,
            "proxy": self.proxy,
            "proxy_weight": self.proxy_weight,
            "start_objective": Objective(problem, _units(start)).report(r0),
            "final": Objective(problem, best.perms).report(best.r),
            "starts": {f.start: f.value for f in found},
            "chosen_start": best.start,
            "changed_units": sum(int((g.perm != start[n].perm).sum()) for n, g in best.perms.items()),
            "correction_angles": eigen_angles(correction),
        }


def _summary(diagnostics: dict[str, Any]) -> dict[str, Any]:
    return {k: diagnostics[k] for k in ("iterations", "final_distance") if k in diagnostics}
