"""The one evaluator: loss and accuracy of models and of the paths between them on a fixed split, on one device;
batches stay there while they fit in `cache_mb`, paths are evaluated functionally (no module copies), and
under torch.distributed each rank reads every world_size-th batch and the sums are all-reduced."""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from tqdm.auto import tqdm

from glmc.alignment import Alignment
from glmc.eval.path_point import MergedParams, interpolated_forward
from glmc.host_memory import RELEASE_ABOVE, release_after, tensor_bytes, trim_heap
from glmc.interpolation import interpolate_state_dicts, merge_configs, merge_params
from glmc.metrics import LOSS_CHUNK_BYTES, loss_and_correct
from glmc.models.canonical import CanonicalTransformer, canonical_forward
from glmc.models.families import family_named

AUTOCAST = {"32": None, "bf16": torch.bfloat16, "16": torch.float16}
# from this size of a path's end (bytes of its tensors) a point is interpolated a layer at a time as the
# forward reads it (glmc.eval.path_point): the same losses, without a third model held beside the two ends
LAYERWISE_POINTS_FROM = RELEASE_ABOVE
PROGRESS_EVERY_S = 10.0  # a path's point ending this long after its last progress line writes one (large models)

log = logging.getLogger(__name__)


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class Functional:
    """A model as (forward(params, inputs) -> logits, its tensors on the device)."""

    def __init__(self, model: torch.nn.Module, device: torch.device):
        self.canonical = isinstance(model, CanonicalTransformer)
        if self.canonical:
            self.config = model.config
            tensors = model.params()
        else:
            model.eval()  # dropout off; the module itself is only a template for functional_call
            self.module, self.options = model, _no_cache(model)
            tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
        self.tensors = {k: v.detach().to(device) for k, v in tensors.items()}

    def forward(self, params: dict[str, Tensor], inputs: Tensor, config: Any = None) -> Tensor:
        """`config`: a canonical model's config to run with instead of its own (a path's, merge_configs)."""
        if self.canonical:
            return canonical_forward(config or self.config, params, inputs)
        return logits_of(torch.func.functional_call(self.module, params, (inputs,), self.options), self.module)

    def output_size(self, example: Tensor) -> int:
        """How many logits one example gives (a language model's: positions x vocabulary)."""
        if self.canonical:
            return canonical_forward(self.config, self.tensors, example).numel()
        return self.forward(self.tensors, example).numel()


def _no_cache(model: torch.nn.Module) -> dict[str, bool]:
    """Keyword arguments that keep a Hugging Face language model from returning its keys and values (a
    cache the loss never reads, a tenth of a large model's forward memory); none for other models."""
    return {"use_cache": False} if "use_cache" in inspect.signature(model.forward).parameters else {}


def logits_of(out: Any, module: torch.nn.Module) -> Tensor:
    """The logits of a model's output (a tensor, or a Hugging Face output with .logits)."""
    if isinstance(out, Tensor):
        return out
    if not hasattr(out, "logits"):  # a body without its head returns hidden states
        raise TypeError(
            f"{type(module).__name__} returned a {type(out).__name__} without logits: evaluate the model "
            "with its head (the class for causal language modelling or image classification, not the bare "
            "body that returns hidden states)"
        )
    return out.logits


def checked_lambdas(lambdas: Sequence[float]) -> list[float]:
    """`lambdas` as floats, each checked before any point is evaluated: TypeError for what is not a sequence
    of numbers, ValueError naming the first that is not in [0, 1] (NaN included)."""
    if isinstance(lambdas, (str, bytes)) or not isinstance(lambdas, Iterable):
        raise TypeError(f"lambdas={lambdas!r} is not a sequence of numbers: pass e.g. [0.0, 0.5, 1.0]")
    values = []
    for i, lam in enumerate(lambdas):
        try:
            values.append(float(lam))
        except (TypeError, ValueError):
            raise TypeError(f"lambdas[{i}]={lam!r} is not a number") from None
        if not 0.0 <= values[-1] <= 1.0:
            what = "is not a number" if math.isnan(values[-1]) else "is outside [0, 1]"
            raise ValueError(
                f"lambdas[{i}]={values[-1]} {what}: pass lambdas in [0, 1] (the path is lam * A + (1 - lam) * B, "
                "from B at 0 to A at 1)"
            )
    return values


class Evaluator:
    """Mean loss and accuracy over `loader` (batches of (inputs, targets)) for a `task`."""

    def __init__(
        self,
        loader: Iterable,
        task: str = "classification",
        device: str | torch.device = "cpu",
        precision: str = "32",
        cache_mb: float = 2048,
        progress: bool = True,
    ):
        if str(precision) not in AUTOCAST:
            raise ValueError(f"eval.precision={precision!r} is not one of {list(AUTOCAST)}")
        self.loader, self.task, self.device = loader, task, torch.device(device)
        self.precision, self.cache_bytes, self.progress = str(precision), cache_mb * 2**20, progress
        self._cache: list[tuple[Tensor, Tensor]] | None = None
        self._streaming = False

    def batches(self) -> Iterator[tuple[Tensor, Tensor]]:
        """This rank's share of the split, on the device; cached after the first full pass."""
        if self._cache is not None:
            yield from self._cache
            return
        rank, world = _world()
        kept, size = [], 0
        for i, (inputs, targets) in enumerate(self.loader):
            if i % world != rank:
                continue
            batch = (inputs.to(self.device, non_blocking=True), targets.to(self.device, non_blocking=True))
            if not self._streaming:
                size += sum(t.numel() * t.element_size() for t in batch)
                if size <= self.cache_bytes:
                    kept.append(batch)
                else:
                    self._streaming, kept = True, []
            yield batch
        if not self._streaming:
            self._cache = kept

    def _autocast(self):
        dtype = AUTOCAST[self.precision]
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    @torch.inference_mode()
    def _metrics(
        self, forward: Callable[[Tensor], Tensor], head: Callable[[Tensor], Tensor] | None = None
    ) -> tuple[float, float]:
        """`head`: forward gives the state the head reads and head(some of its examples) their logits, a
        few examples at a time (a large vocabulary's logits are never held for the whole batch)."""
        totals = torch.zeros(3, dtype=torch.float64, device=self.device)  # loss, correct, count
        for inputs, targets in self.batches():
            with self._autocast():
                out = forward(inputs)
            if head is None:
                totals += self._scored(out, targets)
            else:
                rows, start = 1, 0  # the first example alone: its logits tell how many fit LOSS_CHUNK_BYTES
                while start < len(out):
                    with self._autocast():
                        logits = head(out[start : start + rows])
                    totals += self._scored(logits, targets[start : start + rows])
                    if start == 0:  # from the first example's logits: how many examples fit
                        rows = max(1, LOSS_CHUNK_BYTES // (4 * logits.numel()))
                        start = 1
                    else:
                        start += rows
                    del logits  # freed before the next piece's
            del out  # freed before the next batch's: a large vocabulary's logits are held once
        if _world()[1] > 1:
            dist.all_reduce(totals)
        loss_sum, correct, count = totals.tolist()  # one device sync per model
        if count == 0:
            raise ValueError("the evaluation split is empty: check data.limit_test and the split's files")
        return loss_sum / count, correct / count

    def _scored(self, logits: Tensor, targets: Tensor) -> Tensor:
        """(summed loss, correct, count) of one batch's (or piece's) logits, float64."""
        loss, correct, count = loss_and_correct(logits.float(), targets, self.task)
        count = torch.as_tensor(count, dtype=torch.float64, device=self.device)
        return torch.stack([loss.double(), correct.double(), count])

    def evaluate(self, model: torch.nn.Module) -> tuple[float, float]:
        """Mean loss and accuracy of one model."""
        f = Functional(model, self.device)
        return self._metrics(lambda x: f.forward(f.tensors, x))

    def path(self, alignment: Alignment, lambdas: Sequence[float], desc: str = "path") -> dict[str, list[float]]:
        """Loss and accuracy of lam * reference + (1 - lam) * model for every lam (lam = 1 is A)."""
        curve: dict[str, Any] = {"lambdas": checked_lambdas(lambdas), "loss": [], "accuracy": []}
        fa, fb = Functional(alignment.reference, self.device), Functional(alignment.model, self.device)
        if fa.canonical != fb.canonical:
            raise TypeError("the two ends of a path must both be canonical or both be the original models")
        release_after(fa.tensors.values())  # a large model's matching left its working set's pages behind
        layerwise = tensor_bytes(fa.tensors.values()) >= LAYERWISE_POINTS_FROM
        begun = last_line = time.perf_counter()
        for lam in tqdm(curve["lambdas"], desc=desc, disable=not self.progress, leave=False):
            loss, acc = self._point(fa, fb, [lam, 1.0 - lam], alignment.circuits, layerwise)
            curve["loss"].append(loss)
            curve["accuracy"].append(acc)
            now = time.perf_counter()
            if self.progress and now - last_line >= PROGRESS_EVERY_S:  # a log's line where tqdm only rewrites
                done = len(curve["loss"])
                log.info(
                    "%s: %d of %d points, loss %.4f at lambda %g, %.0f s so far",
                    desc,
                    done,
                    len(curve["lambdas"]),
                    loss,
                    lam,
                    now - begun,
                )
                last_line = now
        return curve

    def _point(
        self, fa: Functional, fb: Functional, weights: list[float], circuits: Sequence[str], layerwise: bool
    ) -> tuple[float, float]:
        """Loss and accuracy at weights[0] * A + weights[1] * B; `layerwise`: never held whole (path_point),
        the last point's freed pages handed back first."""
        ends = [fa.tensors, fb.tensors]
        if layerwise:
            trim_heap()
        if fa.canonical:
            config = merge_configs([fa.config, fb.config], weights)  # B's own eps at lam = 0
            if not layerwise:
                with torch.inference_mode():
                    params = merge_params(ends, weights, circuits)
                return self._metrics(functools.partial(fa.forward, params, config=config))
            merged = MergedParams(ends, weights, circuits)
            family = family_named(config.family)
            return self._metrics(
                lambda x: canonical_forward(config, merged, x, head=False),
                lambda state: family.head(config, merged, state, lambda name, t: None),
            )
        if layerwise:
            with interpolated_forward(fa.module, ends, weights) as model:
                return self._metrics(lambda x: logits_of(model(x, **fa.options), model))
        with torch.inference_mode():
            params = interpolate_state_dicts(ends, weights)
        return self._metrics(functools.partial(fa.forward, params))

    @torch.inference_mode()
    def logits(self, model: torch.nn.Module, max_bytes: int | None = None) -> Tensor:
        """Logits of the first batch (for comparing functions); with `max_bytes`, of as many of its first
        examples as keep the logits within it (at least one): a large vocabulary's are never held whole."""
        f = Functional(model, self.device)
        inputs, _ = next(iter(self.batches()))
        if max_bytes is not None:
            per_example = 4 * f.output_size(inputs[:1])
            inputs = inputs[: max(1, max_bytes // per_example)]
        with self._autocast():
            return f.forward(f.tensors, inputs).float()


def run_evaluators(cfg: Any, data: Any, device: torch.device) -> tuple[Evaluator, Evaluator]:
    """A run's test split evaluator and the one its paths are evaluated with (eval.split's)."""
    options = dict(
        task=cfg.data.task,
        device=device,
        precision=cfg.eval.precision,
        cache_mb=cfg.eval.cache_batches_mb,
        progress=cfg.trainer.enable_progress_bar,
    )
    test = Evaluator(data.test_dataloader(), **options)
    evaluator = test if cfg.eval.split == "test" else Evaluator(data.eval_dataloader(cfg.eval.split), **options)
    return test, evaluator


def evaluate(model: torch.nn.Module, loader: Iterable, task: str = "classification", **options) -> tuple[float, float]:
    """Mean loss and accuracy of `model` over `loader` (options: device, precision)."""
    return Evaluator(loader, task, progress=False, **options).evaluate(model)


def evaluate_path(
    model_a: torch.nn.Module | Alignment,
    model_b: torch.nn.Module | None,
    loader: Iterable,
    lambdas: Sequence[float],
    task: str = "classification",
    circuits: Sequence[str] = (),
    progress: bool = True,
    **options,
) -> dict[str, list[float]]:
    """Loss and accuracy along lam * A + (1 - lam) * B (an Alignment as A: its own parameterisation)."""
    alignment = model_a if isinstance(model_a, Alignment) else Alignment(model_a, model_b, circuits=tuple(circuits))
    return Evaluator(loader, task, progress=progress, **options).path(alignment, lambdas)


def path_losses(
    alignments: dict[str, Alignment], lambdas: Sequence[float], batches: Iterable, task: str, device: torch.device
) -> dict[str, list[float]]:
    """Loss along each alignment's path over the same batches, quietly (MatchContext.path_loss)."""
    check = Evaluator(batches, task, device, progress=False)
    return {name: check.path(alignment, lambdas)["loss"] for name, alignment in alignments.items()}
