"""Weight matching (paper 001 §4.1): data-free alignment of model B to model A.

Each iteration solves the residual map by Procrustes (an assignment for `residual="permutation"`) on the
cross-covariance of A's and B's residual-side weights (the first only on the tensors outside the layers),
then assigns heads on paper 001's circuit cost, MLP units on the cosine of [W_in | b_in | W_out^T] and a
task head's hidden units on the exact inner product. It stops when the relative circuit-form distance
stops improving and returns the best transform seen; late iterations reuse what did not change
(glmc.matching.engine.warm_assignment, glmc.matching.engine.mlp_distance). Grouped rotary families (Llama) match the
factored distance (glmc.matching.engine.in_head, glmc.matching.engine.mlp_units). `keep_mean` makes the orthogonal map
fix the all-ones vector, so merges of mean-zero streams still export to LayerNorm models.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from glmc.alignment import Alignment
from glmc.host_memory import release_after, trim_heap
from glmc.matching.base import MatchContext, Matcher, circuit_pairs, require_factored
from glmc.matching.engine.layerwise import LayerwiseParams
from glmc.matching.engine.problem import LayerDistance, MatchingProblem, Objective, Reuse, SearchState, start_state
from glmc.matching.engine.residual_map import eigen_angles
from glmc.matching.engine.steps import HiddenUnits, LayerStep, Step, iteration_steps
from glmc.metrics import is_token_task
from glmc.models.canonical import CanonicalTransformer
from glmc.models.export import uncentred_writer
from glmc.models.families import family_named
from glmc.ranges import check_settings
from glmc.settings.methods import WeightMatcherConfig
from glmc.symmetry import Orthogonal, Transform, apply
from glmc.symmetry.family_defaults import resolve_residual

log = logging.getLogger(__name__)
PROGRESS_EVERY_S = 10.0  # an iteration (or a large search's layer) ending this long after the last line writes one


class _Progress:
    """The search's progress lines: at most one every PROGRESS_EVERY_S, at the end of an iteration or, in a
    large search, of a layer (a large model's iteration can outlast the half minute a user waits for one)."""

    def __init__(self, max_iter: int) -> None:
        self.max_iter = max_iter
        self.begun = self.last = time.perf_counter()
        self.wrote = False

    def _due(self) -> float | None:
        now = time.perf_counter()
        if now - self.last < PROGRESS_EVERY_S:
            return None
        self.last, self.wrote = now, True
        return now - self.begun

    def done(self, iterations: int, best: float) -> None:
        """A search that wrote lines says when it ends (what follows, applying B's transform, writes none)."""
        if self.wrote:
            log.info(
                "weight matching: done after %d iteration(s), distance %.6f, %.0f s",
                iterations, best, time.perf_counter() - self.begun,
            )  # fmt: skip

    def iteration(self, it: int, value: float) -> None:
        so_far = self._due()
        if so_far is not None:
            log.info(
                "weight matching: iteration %d of at most %d, distance %.6f, %.0f s so far",
                it + 1, self.max_iter, value, so_far,
            )  # fmt: skip

    def layer(self, it: int, done: int, layers: int) -> None:
        so_far = self._due()
        if so_far is not None:
            log.info(
                "weight matching: iteration %d of at most %d, %d of %d layers, %.0f s so far",
                it + 1, self.max_iter, done, layers, so_far,
            )  # fmt: skip


def _iteration(
    steps: list[Step], objective: Objective, state: SearchState, it: int, progress: _Progress | None = None
) -> tuple[float, Transform]:
    """Runs one iteration's steps (a large search: consecutive layer steps a layer at a time, together, the
    last such run also scoring each layer as it is done), then B's weights under the new transform; returns
    its objective and the transform."""
    problem, reuse = objective.problem, objective.reuse
    layerwise = problem.layerwise
    runs = _runs(steps, layerwise)
    last = _scoring_run(runs) if layerwise and LayerDistance.applies(problem, reuse) else None
    distance = None if last is None else LayerDistance(problem, reuse.spec_rest)
    for i, run in enumerate(runs):
        if len(run) == 1 and not (layerwise and isinstance(run[0], LayerStep)):
            tick = time.perf_counter()
            run[0](state, it)
            if run[0].name is not None:
                state.seconds[run[0].name] += time.perf_counter() - tick
        else:
            score = distance.add if distance is not None and i == last else None
            _run_layers(run, state, it, problem.layers, score, progress)
        if layerwise:  # a large search: the run's layers and freed temporaries go back
            for kept in (state.pb_cur, state.pb_res):
                if isinstance(kept, LayerwiseParams):
                    kept.forget()
            trim_heap()
    current = state.transform()
    tick = time.perf_counter()
    state.pb_cur = None  # B's weights are held at most twice more at a time (1B-parameter models)
    state.pb_cur = problem.transformed(state.perms, reuse.spec_rest, state.pb_res)
    if not layerwise:
        state.pb_res = None  # layerwise: pb_cur reads it
    mlp_d2 = reuse.mlp_share(state.res, state.perms) if reuse.late else None
    value = objective(state.pb_cur, current, mlp_d2, None if distance is None else distance.total)
    reuse.rotated = {}
    state.seconds["objective"] += time.perf_counter() - tick
    return value, current


def _runs(steps: list[Step], together: bool) -> list[list[Step]]:
    """The steps in order, each alone, or with `together` consecutive layer steps in one run."""
    runs: list[list[Step]] = []
    for step in steps:
        joins = together and isinstance(step, LayerStep) and bool(runs) and isinstance(runs[-1][-1], LayerStep)
        if joins:
            runs[-1].append(step)
        else:
            runs.append([step])
    return runs


def _scoring_run(runs: list[list[Step]]) -> int | None:
    """The last run of layer steps, where only the head's hidden units (outside the layers) follow it: once
    it is done with a layer, that layer's elements are final."""
    for i in range(len(runs) - 1, -1, -1):
        if isinstance(runs[i][0], LayerStep):
            return i
        if not isinstance(runs[i][0], HiddenUnits):
            return None
    return None


def _run_layers(
    run: list[Step],
    state: SearchState,
    it: int,
    layers: range,
    score: Callable[[SearchState, int], None] | None,
    progress: _Progress | None = None,
) -> None:
    """Layer steps a layer at a time: each of B's transformed layers is read by all of them while it is the
    one kept (the same solutions: their layers depend on the residual map, not on each other); `score`:
    called with each layer once the run is done with it; `progress`: told of each layer done. Freed pages
    go back after the run, not after each layer: the next layer reuses the blocks of the same sizes (handing
    them back and faulting them in again cost a Pythia-160M search a sixth of its time)."""
    shared = []
    for step in run:
        tick = time.perf_counter()
        shared.append(step.begin(state, it))
        state.seconds[step.name] += time.perf_counter() - tick
    for l in layers:
        for step, context in zip(run, shared):
            tick = time.perf_counter()
            step.layer(state, it, l, context)
            state.seconds[step.name] += time.perf_counter() - tick
        if score is not None:
            tick = time.perf_counter()
            score(state, l)
            state.seconds["objective"] += time.perf_counter() - tick
        if progress is not None:
            progress.layer(it, l - layers.start + 1, len(layers))


def _search(
    steps: list[Step], objective: Objective, state: SearchState, max_iter: int, tol: float
) -> tuple[Transform, float, list[float], list[float]]:
    """Iterates from the state until the objective stops improving; returns the best transform seen, its
    objective, the objective at the start and after each iteration, and each iteration's seconds."""
    best_t = state.transform()
    best = objective(state.pb_cur, best_t)
    values: list[float] = [best]
    per_iteration: list[float] = []
    progress = _Progress(max_iter)  # large models: a line per iteration or layer, small ones none
    for it in range(max_iter):
        started = time.perf_counter()
        value, current = _iteration(steps, objective, state, it, progress)
        values.append(value)
        per_iteration.append(time.perf_counter() - started)
        progress.iteration(it, value)
        improved = best - value
        if value < best:
            best, best_t = value, Transform(current)
        # the first iteration saw only the embeddings: always let the full objective run once
        if it > 0 and improved <= tol * max(best, 1e-12):
            break
    progress.done(len(per_iteration), best)
    return best_t, best, values, per_iteration


def _diagnostics(
    best_t: Transform, best: float, values: list[float], per_iteration: list[float], state: SearchState, reuse: Reuse
) -> dict[str, Any]:
    diagnostics: dict[str, Any] = {
        "objective": values,
        "iterations": len(values) - 1,
        "seconds_by_step": dict(state.seconds),
        "seconds_by_iteration": per_iteration,
        "final_distance": best,
    }
    # how many layer-iterations of MLP and head assignment were skipped, certified, solved
    if reuse.mlp is not None:
        diagnostics["mlp_assignments"] = dict(reuse.mlp.counts)
    if reuse.heads is not None:
        diagnostics["head_assignments"] = dict(reuse.heads.counts)
    if isinstance(best_t.get("residual"), Orthogonal):  # paper 001 Fig. 5: how far from the identity
        diagnostics["residual_angles"] = eigen_angles(best_t["residual"].matrix)
    return diagnostics


def weight_matching(
    model_a: CanonicalTransformer,
    model_b: CanonicalTransformer,
    residual: str = "orthogonal",
    heads: bool = True,
    mlp: bool = True,
    max_iter: int = 15,
    tol: float = 1e-6,
    dtype: torch.dtype = torch.float32,
    tokens: Tensor | None = None,
    keep_mean: bool = False,
    threads: int | None = None,
    reuse: bool = True,
    layerwise: bool | None = None,
    device: str | torch.device | None = None,
    options: Mapping[str, Any] | None = None,
) -> tuple[Transform, dict[str, Any]]:
    """Transform T (float32 elements, on B's device) with T(B) close to A in weight space; diagnostics hold
    the per-iteration objective. The search runs in `dtype` (Procrustes and cancellations in float64) on
    `device` (None: where A's weights are). `tokens`: the vocabulary rows compared (None: all). `threads`:
    layers' MLP assignments solved at once (None: torch's thread count; the same solutions). `reuse`: skip
    work whose inputs did not change. `layerwise`: B's transformed weights built layer by layer (the same
    floats; None: by size). `options`: settings of the steps the models' block kinds add (BlockKind.weight_step;
    None: their defaults)."""
    if residual not in ("orthogonal", "signed_permutation", "permutation", "none"):
        raise ValueError(f"residual={residual!r} is not one of orthogonal, signed_permutation, permutation, none")
    if model_a.config.form != "factored" or model_b.config.form != "factored":
        raise ValueError("weight matching reads factored heads: pass models before .to_circuit()")
    with full_float32():
        scales = (options or {}).get("unit_scales", True)
        problem = MatchingProblem.build(model_a, model_b, dtype, tokens, layerwise, device, scales)
        state = start_state(problem, residual, heads, mlp)
        carried = Reuse.build(problem, residual, heads, mlp, reuse)
        kinds = family_named(model_b.config.family).kinds("factored")
        steps = iteration_steps(problem, carried, residual, keep_mean, heads, mlp, threads, kinds, options)
        best_t, best, values, per_iteration = _search(steps, Objective(problem, carried), state, max_iter, tol)
    best_t = best_t.to(device=_device_of(model_b), dtype=torch.float32)
    diagnostics = _diagnostics(best_t, best, values, per_iteration, state, carried)
    diagnostics["device"] = str(problem.device)
    return best_t, diagnostics


@contextmanager
def full_float32():
    """float32 products in full precision for the search's duration: TF32 (or bfloat16) products, where a
    caller allowed them, lose the digits the assignments and certificates compare."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def _device_of(model: CanonicalTransformer) -> torch.device:
    return next(iter(model.params().values())).device


def search_device(setting: str, model: CanonicalTransformer, context: MatchContext | None) -> torch.device:
    """Where weight matching runs for `matcher.weight.device`: cpu, cuda, or auto (where the models are,
    or the run's CUDA device, trainer=gpu, when the models are on the host)."""
    if setting == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            "matcher.weight.device=cuda but torch sees no CUDA device: use matcher.weight.device=auto or cpu"
        )
    if setting != "auto":
        return torch.device(setting)
    device = _device_of(model)
    if device.type == "cpu" and context is not None and context.device.type == "cuda":
        return context.device
    return device


class WeightMatcher(Matcher):
    """`weight`: orthogonal residual + head and MLP permutations; `weight_perm`: all permutations.

    qk / vo: "circuit" interpolates those pairs as circuits, "none" factored. keep_mean: "auto" fixes the
    all-ones vector when both streams are mean-zero, "always" requires that, "never" does not. device:
    where the search runs (search_device). options: the settings of WeightMatcherConfig that the steps of
    block kinds read (weight_matching's `options`)."""

    def __init__(
        self,
        name: str = "weight",
        residual: str = "auto",
        heads: str = "permutation",
        mlp: str = "permutation",
        qk: str = "circuit",
        vo: str = "circuit",
        max_iter: int = 15,
        tol: float = 1e-6,
        vocabulary: str = "train",
        keep_mean: str = "never",
        device: str = "auto",
        **options: Any,
    ):
        check_settings(WeightMatcherConfig, f"matcher.{name}", {**locals(), **options})  # the declared ranges
        unknown = sorted(set(options) - {f.name for f in dataclasses.fields(WeightMatcherConfig)})
        if unknown:
            raise TypeError(f"matcher.{name} has no setting {unknown[0]!r}: see WeightMatcherConfig's settings")
        self.keep_mean, self.device, self.options = keep_mean, device, options
        self.name, self.residual, self.heads, self.mlp = name, residual, heads != "none", mlp != "none"
        self.circuits, self.max_iter, self.tol, self.vocabulary = circuit_pairs(qk, vo), max_iter, tol, vocabulary

    def match(self, a: CanonicalTransformer, b: CanonicalTransformer, context: MatchContext | None = None) -> Alignment:
        require_factored(self.name, a, b)
        tokens = used_tokens(b, context) if self.vocabulary == "train" else None
        residual = resolve_residual(self.residual, family_named(a.config.family))[0]  # auto: the family's widest
        keep_mean = self.resolve_keep_mean(a, b, residual)
        device = search_device(self.device, a, context)
        lean = context is not None and context.lean_memory  # a run of large folders: layer at a time
        transform, diagnostics = weight_matching(
            a,
            b,
            residual,
            self.heads,
            self.mlp,
            self.max_iter,
            self.tol,
            tokens=tokens,
            keep_mean=keep_mean,
            layerwise=True if lean else None,
            device=device,
            options=self.options,
        )
        diagnostics["keep_mean"] = keep_mean
        if tokens is not None:
            diagnostics["vocabulary_rows"] = int(tokens.numel())
        release_after(b.params().values())  # a large search's working set, before B's transformed copy
        # B is the caller's own copy in a run of large folders: transformed in place, not held twice
        return Alignment(a, apply(transform, b, in_place=lean), transform, self.circuits, diagnostics)

    def resolve_keep_mean(self, a: CanonicalTransformer, b: CanonicalTransformer, residual: str) -> bool:
        """Whether the orthogonal residual map is restricted to fix the all-ones vector."""
        if self.keep_mean == "never" or residual != "orthogonal":
            return False  # permutations fix 1 anyway
        for label, model in (("A", a), ("B", b)):
            name = uncentred_writer(model)
            if name is None:
                continue
            if self.keep_mean == "always":
                raise ValueError(
                    f"matcher.{self.name}.keep_mean=always but model {label}'s residual stream is not mean-zero "
                    f"({name} has a non-zero mean over the width): use keep_mean=auto or never"
                )
            return False
        return True


def used_tokens(model: CanonicalTransformer, context: MatchContext | None) -> Tensor | None:
    """For a language model with training data in the context: the ids that occur in it (paper 001's
    restriction of the embedding rows). None for image models or without data."""
    if not is_token_task(model.task) or context is None or context.data is None:
        return None
    vocab = family_named(model.config.family).input_limits(model.params())["vocab"]
    return context.token_ids(vocab, inputs=model.task == "masked_lm")
