"""Activation matching (paper 003, Verma & Elbayad): units paired by how their activations correlate.

Both models run on the same training batches; units are compared by the standardised cross-correlation
of their activations over non-padding tokens (Eq. 1) and assigned to maximise its sum (Eq. 2):
  residual  `identity` (no map), or one stream permutation from the embedding output (`first`), the
            final stream (`last`) or every sublayer's output (`all`); `separate` permutes each state on
            its own (not a symmetry). residual_map=orthogonal fits polar(sum_t x_A,t x_B,t^T) instead,
            signed_permutation assigns on |corr| and negates the coordinates that correlate negatively.
  mlp       per layer; gated units are assigned on |corr| and get mlp_scale = sign(corr) rms(a_A) / rms(a_B),
            ReLU-like units on corr and get mlp_scale = rms(a_A) / rms(a_B).
  heads     the two-stage assignment on the heads' outputs (Eq. 5-6): in-head permutations, then heads on
            their sums; grouped-query attention assigns groups on their query heads' best assignment, with
            one value permutation per group; rotary q/k are left alone. `monotonic` keeps heads in place;
            `ignore` moves features between heads (not a symmetry; refused for grouped-query attention).
  kinds     spaces of a block kind's own, by its hook (BlockKind.activation), where the matcher matches
            that kind's sublayer (mlp or heads not none).
Permuted factored weights are interpolated as they are (qk = vo = none), as in paper 003.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor

from glmc.alignment import Alignment
from glmc.matching.base import MatchContext, Matcher, circuit_pairs, require_factored
from glmc.metrics import IGNORE_INDEX, is_token_task
from glmc.models.blocks.registry import ActivationHook, hook
from glmc.models.canonical import CanonicalTransformer, canonical_forward
from glmc.models.families import family_named
from glmc.models.families.base import role_of
from glmc.models.families.roles import layer_of
from glmc.ranges import check_settings
from glmc.settings.methods import ActivationMatcherConfig
from glmc.symmetry import (
    Diagonal,
    Orthogonal,
    OrthogonalScale,
    Permutation,
    PositiveDiagonal,
    SignedPermutation,
    SymmetrySpec,
    Transform,
    apply,
)


class CrossMoments:
    """Running sums of two feature sets over tokens, enough for their correlation and cross-moment."""

    def __init__(self):
        self.n = 0
        self.sum_a = self.sum_b = self.sq_a = self.sq_b = self.cross = 0.0

    def update(self, a: Tensor, b: Tensor) -> None:
        a, b = a.double(), b.double()  # (tokens, units)
        self.n += a.shape[0]
        self.sum_a = self.sum_a + a.sum(0)
        self.sum_b = self.sum_b + b.sum(0)
        self.sq_a = self.sq_a + a.pow(2).sum(0)
        self.sq_b = self.sq_b + b.pow(2).sum(0)
        self.cross = self.cross + a.T @ b

    def correlation(self) -> Tensor:
        """Standardised cross-correlation (units_A, units_B); constant units correlate with nothing."""
        mu_a, mu_b = self.sum_a / self.n, self.sum_b / self.n
        cov = self.cross / self.n - torch.outer(mu_a, mu_b)
        sd_a = (self.sq_a / self.n - mu_a.pow(2)).clamp_min(0).sqrt()
        sd_b = (self.sq_b / self.n - mu_b.pow(2)).clamp_min(0).sqrt()
        return cov / torch.outer(sd_a, sd_b).clamp_min(1e-12)

    def normalised_cross(self) -> Tensor:
        """sum_t a_t b_t^T scaled so that every recorded state counts alike when summed."""
        return self.cross / (self.sq_a.sum() * self.sq_b.sum()).sqrt().clamp_min(1e-12)


def residual_states(num_layers: int, strategy: str) -> list[str]:
    """The recorded stream states a residual strategy reads (canonical_forward's record names)."""
    if strategy in ("identity", "first", "last"):
        return {"identity": [], "first": ["embed"], "last": ["final"]}[strategy]
    layers = [f"blocks.{l}.{s}" for l in range(num_layers) for s in ("attn_out", "mlp_out")]
    return ["embed"] + layers if strategy == "separate" else layers


def record_moments(
    a: CanonicalTransformer, b: CanonicalTransformer, batches, names: set[str], task: str, device: torch.device
) -> dict[str, CrossMoments]:
    """Run A and B on the same batches and accumulate the cross-moments of the named states."""
    moments = {n: CrossMoments() for n in names}
    pa = {k: v.detach().to(device) for k, v in a.params().items()}
    pb = {k: v.detach().to(device) for k, v in b.params().items()}
    with torch.inference_mode():
        for inputs, targets in batches:
            inputs, targets = inputs.to(device), targets.to(device)
            keep = (targets != IGNORE_INDEX).reshape(-1) if is_token_task(task) else None
            states: dict[tuple[str, str], Tensor] = {}
            for key, config, params in (("a", a.config, pa), ("b", b.config, pb)):
                canonical_forward(config, params, inputs, _recorder(states, key, names))
            for name in names:
                xa, xb = (_tokens(states[k, name]) for k in ("a", "b"))
                if keep is not None:
                    xa, xb = xa[keep], xb[keep]
                moments[name].update(xa, xb)
    return moments


def _recorder(states: dict, key: str, names: set[str]):
    def record(name: str, t: Tensor) -> None:
        if name in names:
            states[key, name] = t

    return record


def _tokens(t: Tensor) -> Tensor:
    """(B, T, n) or per-head (B, H, T, dv) -> (B*T, units), heads in order, dims within each head."""
    if t.dim() == 4:
        t = t.permute(0, 2, 1, 3).flatten(2)
    return t.reshape(-1, t.shape[-1])


def assign(similarity: Tensor) -> tuple[np.ndarray, float]:
    """Permutation maximising sum_i similarity[i, perm[i]] and that sum."""
    s = similarity.detach().cpu().double().numpy()
    rows, cols = linear_sum_assignment(s, maximize=True)
    return cols, float(s[rows, cols].sum())


def two_stage_heads(corr: Tensor, heads: int, monotonic: bool = False) -> tuple[Permutation, Tensor]:
    """Paper 003 Algorithm 1: head assignment on the best in-head costs, then the in-head permutations.

    Returns the head permutation (new head i = B's head perm[i]) and (H, dv, dv) permutation matrices,
    one per new head, mapping its B dimensions onto A's."""
    outer, _, matrices, _ = grouped_two_stage(corr, heads, 1, monotonic)
    return outer, matrices


def grouped_two_stage(
    corr: Tensor, groups: int, size: int, monotonic: bool = False
) -> tuple[Permutation, Permutation, Tensor, Tensor]:
    """Two-stage assignment for `groups` key/value groups of `size` query heads (query head k * size + g
    of group k); corr (H*dv, H*dv) between A's and B's head outputs, features ordered (head, dim).

    Returns (group permutation, (groups, size) query-head permutations, (groups, dv, dv) value-dim
    permutation matrices, for every A feature the B feature matched to it)."""
    heads = groups * size
    dv = corr.shape[0] // heads
    blocks = corr.reshape(heads, dv, heads, dv).permute(0, 2, 1, 3)  # (H_A, H_B, dv, dv)
    same = [(i, i) for i in range(heads)]
    pairs = same if monotonic else itertools.product(range(heads), range(heads))
    head_cost = torch.full((heads, heads), -float("inf"), dtype=torch.float64)
    for i, j in pairs:
        head_cost[i, j] = assign(blocks[i, j])[1]
    inner: dict[tuple[int, int], Tensor] = {}
    group_cost = torch.full((groups, groups), -float("inf"), dtype=torch.float64)
    for ka, kb in [(k, k) for k in range(groups)] if monotonic else itertools.product(range(groups), repeat=2):
        sub = head_cost[ka * size : (ka + 1) * size, kb * size : (kb + 1) * size]
        if monotonic:
            inner[ka, kb], group_cost[ka, kb] = torch.arange(size), float(sub.diagonal().sum())
        else:
            cols, group_cost[ka, kb] = assign(sub)
            inner[ka, kb] = torch.as_tensor(cols)
    outer = torch.arange(groups) if monotonic else torch.as_tensor(assign(group_cost)[0])
    qheads = torch.stack([inner[k, int(outer[k])] for k in range(groups)])
    matrices, full = [], []
    for k in range(groups):
        partners = [int(outer[k]) * size + int(qheads[k, g]) for g in range(size)]
        summed = sum(blocks[k * size + g, partners[g]] for g in range(size))
        dims = torch.as_tensor(assign(summed)[0])
        matrices.append(torch.eye(dv)[dims])
        full += [(h * dv + dims) for h in partners]
    return Permutation(outer), Permutation(qheads), torch.stack(matrices), torch.cat(full)


def activation_scales(moments: CrossMoments, corr: Tensor, perm: Tensor) -> Diagonal:
    """Per new unit i (B's unit perm[i], matched to A's unit i) the non-zero scale of B's linear branch
    that gives its activation A's sign and root mean square: sign(corr) * rms(a_A,i) / rms(a_B,perm[i]);
    1 where either unit never activates."""
    idx = torch.arange(len(perm))
    sq_a, sq_b = moments.sq_a, moments.sq_b[perm]
    live = (sq_a > 0) & (sq_b > 0)
    magnitude = torch.where(live, (sq_a / sq_b.clamp_min(1e-300)).sqrt(), torch.ones_like(sq_a))
    sign = torch.where(corr[idx, perm] < 0, -1.0, 1.0).double()
    return Diagonal((sign * magnitude).float())


def mean_matched(corr: Tensor, perm: Tensor | None = None) -> float:
    """Mean correlation of A's unit i with its partner (B's unit perm[i], or unit i)."""
    idx = torch.arange(corr.shape[0]) if perm is None else perm.cpu()
    return float(corr[torch.arange(corr.shape[0]), idx].mean())


def _stream_state(role, layer: int | None, side: str, layers: int) -> str:
    """The recorded stream state a residual-side tensor writes into or reads from (canonical_forward's
    names): its sublayer's output for writers, the state before its sublayer for readers."""
    last = f"blocks.{layers - 1}.mlp_out" if layers else "embed"
    if role.stage == "embed":
        return "embed"
    if role.stage == "head":
        return last
    if side == "out":
        return f"blocks.{layer}.{role.stage}_out"
    if role.stage == "mlp":
        return f"blocks.{layer}.attn_out"
    return "embed" if layer == 0 else f"blocks.{layer - 1}.mlp_out"


def _permute_heads_jointly(model: CanonicalTransformer, perms: dict[int, Tensor]) -> CanonicalTransformer:
    """Per layer, one permutation of the heads' features taken together (heads times head dimension)
    on every tensor of the per-head pairs: queries, keys and values rows, output columns. Not
    function-preserving: features move between heads (paper 003's Ignore-Heads)."""
    p = {k: v.detach().clone() for k, v in model.params().items()}
    layout = family_named(model.config.family).layout(model.config)
    for name in p:
        role, layer = role_of(layout, name), layer_of(name)
        pair = [a for a in role.acts if a.head_axis is not None] if role else []
        if layer not in perms or not pair:
            continue
        t = p[name].movedim((pair[0].head_axis, pair[0].axis), (0, 1))
        joined = t.reshape(-1, *t.shape[2:])
        if joined.shape[0] != perms[layer].numel():
            raise ValueError(f"heads=ignore needs equal query/key and value head sizes ({name}: {tuple(t.shape)})")
        t = joined[perms[layer]].reshape(t.shape)
        p[name] = t.movedim((0, 1), (pair[0].head_axis, pair[0].axis)).contiguous()
    return CanonicalTransformer(model.config, p)


def _permute_residual_separately(model: CanonicalTransformer, perms: dict[str, Tensor]) -> CanonicalTransformer:
    """Each stream state gets its own permutation: writers into a state and readers of it use that
    state's. Not function-preserving (paper 003's `separate`)."""
    p = {k: v.detach().clone() for k, v in model.params().items()}
    layout = family_named(model.config.family).layout(model.config)
    for name in p:
        role = role_of(layout, name)
        for acts in role.acts_on("residual"):
            perm = perms.get(_stream_state(role, layer_of(name), acts.side, model.num_layers))
            if perm is not None:
                p[name] = p[name].index_select(acts.axis, perm.to(p[name].device))
    return CanonicalTransformer(model.config, p)


class ActivationMatcher(Matcher):
    """`activation` (residual permutation) and `activation_orth` (residual Procrustes); see the module docstring.

    residual: first | last | all | separate (which stream states fit the residual map)
    residual_map: permutation | orthogonal;  heads: two_stage | monotonic | none;  mlp: permutation | none
    batches: training batches whose activations are recorded; qk / vo: circuit | none (interpolation)."""

    def __init__(
        self,
        name: str = "activation",
        residual: str = "all",
        residual_map: str = "permutation",
        heads: str = "two_stage",
        mlp: str = "permutation",
        qk: str = "none",
        vo: str = "none",
        batches: int = 16,
    ):
        check_settings(ActivationMatcherConfig, f"matcher.{name}", locals())  # the ranges glmc.settings declares
        if residual in ("separate", "identity") and residual_map == "orthogonal":
            raise ValueError(f"matcher.{name}.residual={residual} fits no orthogonal map: use residual_map=permutation")
        self.name, self.residual, self.residual_map = name, residual, residual_map
        self.heads, self.mlp, self.batches = heads, mlp, batches
        self.circuits = circuit_pairs(qk, vo)

    def match(self, a: CanonicalTransformer, b: CanonicalTransformer, context: MatchContext | None = None) -> Alignment:
        require_factored(self.name, a, b)
        self.check_family(b)
        context = context or MatchContext()
        start = time.perf_counter()
        states = residual_states(a.num_layers, self.residual)
        spec = SymmetrySpec.from_model(a)
        units = self.mlp != "none" and "mlp.0" in spec.spaces  # a block kind's own MLP may have no such units
        hooks = self.kind_hooks(a)
        names = self.recorded_names(a.num_layers, states, units)
        names |= {f"blocks.{l}.{s}" for l in range(a.num_layers) for h in hooks for s in h.states}
        batches = itertools.islice(iter(context.train_batches(self.name)), self.batches)
        moments = record_moments(a, b, batches, names, a.task, context.device) if names else {}
        recorded = time.perf_counter()

        transform, correlation = Transform(), {}
        joint: dict[int, Tensor] = {}  # heads=ignore: per layer, one permutation of all heads' features
        for l in range(a.num_layers):
            if units:
                self.match_mlp(moments[f"blocks.{l}.mlp_act"], spec, l, transform, correlation)
            for h in hooks:
                hook(h.match)(moments, spec, l, transform, correlation)
            if self.heads == "ignore":
                corr = moments[f"blocks.{l}.heads"].correlation()
                joint[l] = torch.as_tensor(assign(corr)[0])
                correlation[f"heads.{l}"] = (mean_matched(corr), mean_matched(corr, joint[l]))
            elif self.heads != "none":
                self.match_heads(moments[f"blocks.{l}.heads"].correlation(), spec, l, transform, correlation)
        separate = self.match_residual(moments, states, transform, correlation)
        # `separate` and heads=ignore are not symmetries of the model
        function_preserving = self.residual != "separate" and not joint
        aligned = apply(transform, b)
        if separate:
            aligned = _permute_residual_separately(aligned, separate)
        if joint:
            aligned = _permute_heads_jointly(aligned, joint)
        diagnostics: dict[str, Any] = {
            "tokens": moments[min(names)].n if names else 0,
            "batches": self.batches,
            "seconds_recording": recorded - start,
            "seconds_assignment": time.perf_counter() - recorded,
            # mean correlation of matched units: (before, after) per space
            "mean_correlation": {k: list(v) for k, v in correlation.items()},
        }
        kept = transform if function_preserving else None
        return Alignment(a, aligned, kept, self.circuits, diagnostics, function_preserving=function_preserving)

    def check_family(self, b: CanonicalTransformer) -> None:
        family = family_named(b.config.family)
        if self.heads == "ignore" and family.attention_block().grouped:
            raise ValueError(
                f"matcher.{self.name}.heads=ignore: model.family={family.name} has grouped-query attention, whose "
                "query heads share their group's keys and values, so features cannot be assigned across heads one "
                "by one: use heads=two_stage, monotonic or none"
            )

    def kind_hooks(self, model: CanonicalTransformer) -> list[ActivationHook]:
        """The activation hooks of the model's block kinds whose sublayer this matcher matches."""
        matched = {"attention": self.heads != "none", "mlp": self.mlp != "none"}
        kinds = family_named(model.config.family).kinds(model.config.form)
        return [k.activation for k in kinds if k.activation is not None and matched.get(k.sublayer, True)]

    def recorded_names(self, layers: int, states: list[str], units: bool) -> set[str]:
        """The activations to record: the residual `states`, and per layer the MLP units (`units`) and heads'
        outputs."""
        names = set(states)
        names |= {f"blocks.{l}.mlp_act" for l in range(layers)} if units else set()
        names |= {f"blocks.{l}.heads" for l in range(layers)} if self.heads != "none" else set()
        return names

    @staticmethod
    def match_mlp(m: CrossMoments, spec: SymmetrySpec, l: int, transform: Transform, correlation: dict) -> None:
        """Layer l's MLP units (and, gated, their scales) into `transform`, their mean correlations into
        `correlation`."""
        corr = m.correlation()
        scale = spec.spaces.get(f"mlp_scale.{l}")
        if scale is not None and "positive_diagonal" in scale.classes:  # ReLU-like: the scale, not the sign
            perm = torch.as_tensor(assign(corr)[0])
            transform[f"mlp.{l}"] = Permutation(perm)
            transform[f"mlp_scale.{l}"] = PositiveDiagonal(activation_scales(m, corr, perm).scales.abs())
        elif scale is not None:  # gated: a unit's sign and scale are free
            perm = torch.as_tensor(assign(corr.abs())[0])
            transform[f"mlp.{l}"] = Permutation(perm)
            transform[f"mlp_scale.{l}"] = activation_scales(m, corr, perm)
            corr = corr.abs()  # matched with the better sign, in place or not
        else:
            transform[f"mlp.{l}"] = Permutation(torch.as_tensor(assign(corr)[0]))
        correlation[f"mlp.{l}"] = (mean_matched(corr), mean_matched(corr, transform[f"mlp.{l}"].perm))

    def match_heads(self, corr: Tensor, spec: SymmetrySpec, l: int, transform: Transform, correlation: dict) -> None:
        """Layer l's heads by the two-stage assignment (groups, query heads, in-head permutations)."""
        groups = spec[f"vo.{l}"].heads  # key/value groups (every head its own without grouping)
        size = spec[f"qheads.{l}"].size if f"qheads.{l}" in spec.spaces else 1
        outer, qheads, inner, full = grouped_two_stage(corr, groups, size, self.heads == "monotonic")
        transform[f"heads.{l}"] = outer
        if size > 1:
            transform[f"qheads.{l}"] = qheads
        transform[f"vo.{l}"] = OrthogonalScale(inner, torch.ones(groups))
        qk = spec.spaces.get(f"qk.{l}")  # none where a norm on queries and keys keeps no qk maps
        # same dims and a group that holds permutations: Q/K take V's permutation (not rotary Q/K)
        if qk is not None and size == 1 and qk.size == inner.shape[-1] and "orthogonal_scale" in qk.classes:
            transform[f"qk.{l}"] = OrthogonalScale(inner, torch.ones(groups))
        correlation[f"heads.{l}"] = (mean_matched(corr), mean_matched(corr, full))

    def match_residual(
        self, moments: dict[str, CrossMoments], states: list[str], transform: Transform, correlation: dict
    ) -> dict[str, Tensor]:
        """The residual map into `transform`; for `separate`, returns each stream state's own permutation."""
        separate = {}
        if self.residual == "separate":
            for state in states:
                corr = moments[state].correlation()
                separate[state] = torch.as_tensor(assign(corr)[0])
                correlation[state] = (mean_matched(corr), mean_matched(corr, separate[state]))
        elif self.residual == "identity":
            pass
        elif self.residual_map == "permutation":
            corr = sum(moments[s].correlation() for s in states) / len(states)
            transform["residual"] = Permutation(torch.as_tensor(assign(corr)[0]))
            correlation["residual"] = (mean_matched(corr), mean_matched(corr, transform["residual"].perm))
        elif self.residual_map == "signed_permutation":  # a flipped coordinate correlates negatively
            corr = sum(moments[s].correlation() for s in states) / len(states)
            transform["residual"] = SignedPermutation.project(corr.float())
            flipped = corr * transform["residual"].signs.to(corr.dtype)[:, None]
            correlation["residual"] = (mean_matched(corr), mean_matched(flipped, transform["residual"].perm))
        else:
            cross = sum(moments[s].normalised_cross() for s in states)
            transform["residual"] = Orthogonal(Orthogonal.project(cross).matrix.float())
        return separate
