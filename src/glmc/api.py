"""Public entry points for people who bring their own models: models and inputs are checked before any work,
with an error that says what does not fit, not one from inside a forward pass."""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import TensorDataset

from glmc.alignment import Alignment
from glmc.api_inputs import (
    check_loader,
    check_model,
    check_pair,
    check_run_dir,
    family_of,
    path_reference,
    resolve_task,
    untied_ends,
)
from glmc.choices import ResidualClass
from glmc.curves import fit as _curves
from glmc.eval import evaluator as _evaluator
from glmc.eval import layerwise as _layerwise
from glmc.eval import plane as _plane
from glmc.matching.base import MatchContext, Matcher
from glmc.matching.registry import METHODS, build_matcher, default_method_config
from glmc.metrics import IGNORE_INDEX, is_token_task
from glmc.models.canonical import CanonicalTransformer
from glmc.models.compatibility import check_compatible, residual_class_problem
from glmc.models.convert import to_canonical as _convert
from glmc.models.families import family_named, family_of_model_type
from glmc.symmetry.family_defaults import resolve_residual


def to_canonical(hf_model: torch.nn.Module, name: str = "the model") -> CanonicalTransformer:
    """The canonical form of a Hugging Face model (a canonical one as it is), after the checks of align and
    evaluate (check_model), which name `name`."""
    check_model(hf_model, name)
    return _convert(hf_model, name)


def align(
    model_a: torch.nn.Module,
    model_b: torch.nn.Module,
    matcher: str | Matcher = "weight",
    data: Any = None,
    *,
    run_dir: str | Path | None = None,
    trainer: dict[str, Any] | None = None,
    device: str | torch.device = "cpu",
    **options,
) -> Alignment:
    """Align model B to model A, of the same architecture (Hugging Face models of a known family, or canonical).

    `matcher`: a registry method name whose settings `options` override, or an object with `match(a, b,
    context)`. `data`: training batches for data-driven methods, read more than once: a list of (inputs,
    targets) pairs, a DataLoader or a LightningDataModule (a generator, read only once, is refused). Learned
    matching trains with a Lightning Trainer (`trainer` settings), checkpointing into `run_dir` (a temporary
    folder if None). Returns an Alignment: `.model` is B transformed (B's function), `.reference` A in the
    same parameterisation."""
    node, symmetry = None, {}
    if isinstance(matcher, str):
        if matcher not in METHODS:
            raise ValueError(f"matcher={matcher!r} is not one of {list(METHODS)}")
        node = default_method_config(matcher, **options)  # a misspelled option fails here, before any work
    elif options:
        raise TypeError("options apply to a matcher given by name")
    elif not callable(getattr(matcher, "match", None)):
        raise ValueError(
            f"matcher={matcher!r} has no match(a, b, context) method: pass a method name ({', '.join(METHODS)}) "
            "or an object with one"
        )
    check_model(model_a, "model_a")
    check_model(model_b, "model_b")
    check_run_dir(run_dir)
    a, b = _convert(model_a, "model_a"), _convert(model_b, "model_b")
    if node is not None:
        # residual=auto: the family's widest class (activation matching's `residual` is no class)
        if str(node.get("residual")) in {c.value for c in ResidualClass}:
            family = family_named(a.config.family)
            node.residual, source = resolve_residual(node.residual, family)
            problem = residual_class_problem(family, node.residual, "residual")
            if problem:
                raise ValueError(problem)
            symmetry = {"residual": str(node.residual), "source": source}
        matcher = build_matcher(node)
    check_compatible(a, b, equal_mlp=getattr(matcher, "equal_mlp_widths", True))
    if data is not None:
        check_data(a, data)
    # imported here: Lightning loads only when a model is aligned, not with `import glmc`
    from glmc.train.latent_fit import fit_latents

    with tempfile.TemporaryDirectory(prefix="glmc-align-") as scratch:
        context = MatchContext(
            data=data,
            trainer=_trainer(trainer),
            run_dir=Path(run_dir or scratch),
            device=torch.device(device),
            fit=fit_latents,
            path_loss=_evaluator.path_losses,
        )
        alignment = matcher.match(a, b, context)
    if symmetry:
        alignment.diagnostics["symmetry"] = symmetry
    return alignment


def evaluate(model: torch.nn.Module, loader: Iterable, task: str | None = None, **options) -> tuple[float, float]:
    """Mean loss and accuracy of `model` over `loader` (options: device, precision), every batch checked
    against the model; `task` is read from the model when not given."""
    check_model(model, "model")
    check_loader(loader, "loader")
    task = resolve_task(model, task)
    return _evaluator.evaluate(model, CheckedBatches(loader, model, task), task, **options)


def evaluate_path(
    model_a: torch.nn.Module | Alignment,
    model_b: torch.nn.Module | None,
    loader: Iterable,
    lambdas: Sequence[float],
    task: str | None = None,
    circuits: Sequence[str] = (),
    progress: bool = True,
    **options,
) -> dict[str, list[float]]:
    """Loss and accuracy along lam * A + (1 - lam) * B (an Alignment as A and None for B: its own
    parameterisation and circuits), every batch checked against A; `task` is read from A when not given.
    Where one original model's output head is tied to its embedding and the other's is not, the path runs
    between an untied copy of the tied one (its function, other tensors shared) and the other, as a run does;
    the models passed in are left as they are."""
    reference = path_reference(model_a, model_b)
    model_a, model_b = untied_ends(model_a, model_b)
    check_loader(loader, "loader")
    task = resolve_task(reference, task, "model_a")
    checked = CheckedBatches(loader, reference, task)
    return _evaluator.evaluate_path(model_a, model_b, checked, lambdas, task, circuits, progress, **options)


def evaluate_layerwise(
    model_a: torch.nn.Module | Alignment,
    model_b: torch.nn.Module | None,
    loader: Iterable,
    lambdas: Sequence[float],
    task: str | None = None,
    circuits: Sequence[str] = (),
    cumulative: bool = False,
    progress: bool = True,
    **options,
) -> dict[str, Any]:
    """Layer-wise barriers (glmc.eval.layerwise): the loss along lam * A + (1 - lam) * B with only one part
    (embed, block l, head; `cumulative`: parts 0..l too) interpolated, the rest held at A and at B; the
    models and batches checked as evaluate_path checks them."""
    reference = path_reference(model_a, model_b)
    model_a, model_b = untied_ends(model_a, model_b)
    check_loader(loader, "loader")
    task = resolve_task(reference, task, "model_a")
    checked = CheckedBatches(loader, reference, task)
    return _layerwise.evaluate_layerwise(
        model_a, model_b, checked, lambdas, task, circuits, cumulative, progress, **options
    )


def evaluate_plane(
    models: Sequence[torch.nn.Module],
    loader: Iterable,
    grid: int = 11,
    margin: float = 0.2,
    task: str | None = None,
    progress: bool = True,
    **options,
) -> dict[str, Any]:
    """The loss over the plane through three models (canonical factored, or original models of one
    architecture) on a grid x grid lattice over their bounding box widened by `margin`: the lattice (x, y,
    loss and accuracy by [row y][column x]), the models' coordinates and their own losses."""
    models = list(models)
    if len(models) != 3:
        raise ValueError(f"models: a plane passes through three models, not {len(models)}")
    for i, model in enumerate(models):
        check_model(model, f"models[{i}]")
    check_loader(loader, "loader")
    task = resolve_task(models[0], task, "models[0]")
    checked = CheckedBatches(loader, models[0], task)
    return _plane.evaluate_plane(models, checked, grid, margin, task, progress, **options)


def fit_curve(
    models: Alignment | Sequence[torch.nn.Module],
    data: Any,
    kind: str = "bezier",
    bends: int = 1,
    *,
    max_steps: int = 300,
    lr: float = 0.01,
    seed: int = 0,
    run_dir: str | Path | None = None,
    trainer: dict[str, Any] | None = None,
    device: str | torch.device = "cpu",
) -> Any:
    """A curve from A to B (Garipov et al. 2018) whose bends train on `data` (as align takes it), the ends
    fixed: `kind` bezier (bends=1: quadratic) or chain (a polygon through `bends` points). `models`: an
    Alignment (its ends, in their canonical forms, and circuits) or two models. Checkpoints go to `run_dir`
    (a temporary folder if None), where a rerun resumes. The Curve's `.point(lam)` is its model at lam (1: A,
    0: B), `.path(glmc.Evaluator(loader, task), lambdas)` its losses, `.diagnostics` its training's."""
    from glmc.curves.curve import CurveSettings

    settings = CurveSettings(kind=kind, bends=bends, max_steps=max_steps, lr=lr, seed=seed, where="fit_curve")
    if not isinstance(models, Alignment):
        if isinstance(models, torch.nn.Module) or len(models) != 2:
            raise TypeError("fit_curve takes an Alignment or a pair of models (model_a, model_b)")
        models = Alignment(*models)
    check_run_dir(run_dir)
    a, b = to_canonical(models.reference, "model_a"), to_canonical(models.model, "model_b")
    check_compatible(a, b)
    check_data(a, data)
    return _curves.fit_curve(a, b, data, settings, models.circuits, run_dir, _trainer(trainer), device)


def model_limits(model: Any) -> dict[str, Any]:
    """What a model accepts, as its family states it (positions, vocabulary, classes, channels, image size);
    empty for a model of no known family."""
    if isinstance(model, CanonicalTransformer):
        family = family_named(model.config.family)
        return {**family.input_limits(model.params()), **_image_limits(model, family)}
    config = getattr(model, "config", None)
    try:
        family = family_of_model_type(getattr(config, "model_type", None))
    except ValueError:
        return {}
    return {**family.hf_input_limits(config), **_image_limits(model, family)}


def _image_limits(model: Any, family: Any) -> dict[str, Any]:
    """An image model's channels and (height, width): from its HF config, or a canonical model's patches."""
    if family.data_kind != "images":
        return {}
    config = model.config
    if not isinstance(model, CanonicalTransformer):
        size = config.image_size
        size = tuple(size) if isinstance(size, Sequence) else (size, size)
        return {"channels": config.num_channels, "image_size": size}
    patches = model.params()["embed.pos"].shape[0] - 1
    side = math.isqrt(patches)
    limits = {"channels": config.num_channels}
    if side * side == patches:  # a grid of another shape is left to the forward's own check
        limits["image_size"] = (side * config.patch_size,) * 2
    return limits


def check_image_shape(limits: dict[str, Any], inputs: torch.Tensor) -> None:
    """ValueError for images of other channels or size than the model `limits` describes reads."""
    channels, size = limits.get("channels"), limits.get("image_size")
    if channels is None or inputs.dim() != 4:
        return
    if inputs.shape[1] == channels and (size is None or tuple(inputs.shape[2:]) == size):
        return
    height, width = size or ("height", "width")
    expected = f"[batch, {channels}, {height}, {width}]"
    raise ValueError(
        f"inputs of shape {tuple(inputs.shape)} do not fit the model, which reads images of shape {expected} "
        f"({channels} channel{'s' * (channels != 1)}{f', {height}x{width} pixels' if size else ''}): "
        "prepare the images with the model's own image processor (its channels and size)"
    )


def check_batch(limits: dict[str, Any], inputs: Any, targets: Any, task: str) -> None:
    """ValueError when a batch does not fit the model `limits` describes (model_limits)."""
    if not isinstance(inputs, torch.Tensor) or not isinstance(targets, torch.Tensor):
        return
    check_image_shape(limits, inputs)
    if "vocab" in limits:
        positions, vocab = limits.get("positions"), limits["vocab"]  # rotary models: no position table
        if positions is not None and inputs.dim() >= 1 and inputs.shape[-1] > positions:
            raise ValueError(
                f"inputs of {inputs.shape[-1]} tokens are longer than the model's {positions} positions: "
                f"cut the sequences to at most {positions} tokens (e.g. data.seq_len={positions})"
            )
        outside = inputs[(inputs < 0) | (inputs >= vocab)]
        if outside.numel():
            raise ValueError(
                f"input token id {int(outside[0])} is outside the model's vocabulary of {vocab} ids (0 to "
                f"{vocab - 1}): tokenize with the model's own tokenizer"
            )
        if is_token_task(task):
            outside = targets[((targets < 0) & (targets != IGNORE_INDEX)) | (targets >= vocab)]
            if outside.numel():
                raise ValueError(
                    f"target token id {int(outside[0])} is outside the model's vocabulary of {vocab} ids (0 to "
                    f"{vocab - 1}, or {IGNORE_INDEX} for padding)"
                )
    classes = limits.get("classes")
    if task == "classification" and classes is not None:
        outside = targets[(targets < 0) | (targets >= classes)]
        if outside.numel():
            raise ValueError(
                f"label {int(outside[0])} is outside the model's {classes} classes (0 to {classes - 1}): number "
                f"the labels from 0, or use a model with num_labels > {int(targets.max())}"
            )


EMPTY_HINT = (
    "pass a non-empty iterable of (inputs, targets) batches (an empty list, a generator already used up, or a "
    "DataLoader with drop_last=True over fewer samples than batch_size yields none)"
)


def scores_something(targets: torch.Tensor, task: str) -> bool:
    """Whether a batch's targets hold a prediction the loss counts: a label, a token not IGNORE_INDEX
    (causal LM: after the first position)."""
    if not is_token_task(task):
        return targets.numel() > 0
    counted = targets[:, 1:] if task == "causal_lm" and targets.dim() >= 2 else targets
    return bool((counted != IGNORE_INDEX).any())


_NOTHING_SCORED = {
    "classification": "every batch is empty (no labels); pass batches of at least one input",
    "masked_lm": f"every target is {IGNORE_INDEX}; give the masked positions their token ids",
    "causal_lm": f"every target after the first position is {IGNORE_INDEX} (causal LM predicts token t+1 from "
    "tokens up to t, so sequences of one token score nothing); give the positions to score their token ids",
}


class CheckedBatches:
    """`loader`'s batches (inputs, targets), each checked against `model` (check_batch) as it is read;
    ValueError at the end of a pass that yielded no batch, or none with a target to score."""

    def __init__(self, loader: Iterable, model: Any, task: str):
        self.loader, self.limits, self.task = loader, model_limits(model), task
        self.family = family_of(model)

    def __iter__(self) -> Iterator[Any]:
        seen = scored = False
        for batch in self.loader:
            inputs, targets = check_pair(self.family, batch, self.task, "loader")
            check_batch(self.limits, inputs, targets, self.task)
            seen, scored = True, scored or scores_something(targets, self.task)
            yield batch
        if not seen:
            raise ValueError(f"loader yielded no batches: {EMPTY_HINT}")
        if not scored:
            raise ValueError(f"loader's batches hold nothing to score: {_NOTHING_SCORED[self.task]}")


def check_data(model: CanonicalTransformer, data: Any) -> None:
    """align's training data against `model`: a DataLoader of a TensorDataset whole, other data by its first
    batch (the random states drawing it advances restored); a LightningDataModule is left to its loaders."""
    if hasattr(data, "train_dataloader"):
        return
    check_loader(data, "data")
    if isinstance(data, Iterator):  # its first batch, read here, would be gone; a second pass yields none
        raise TypeError(
            f"data is a {type(data).__name__}, which yields its batches only once, but matching reads them again "
            "(learned matching for every epoch): pass a list of (inputs, targets) batches (e.g. list(data)) or "
            "a DataLoader"
        )
    limits, task = model_limits(model), model.task
    dataset = getattr(data, "dataset", None)
    if isinstance(dataset, TensorDataset) and len(dataset.tensors) >= 2:
        if len(data) == 0:
            raise ValueError(f"data yields no batches (its dataset has {len(dataset)} samples): {EMPTY_HINT}")
        batch = dataset.tensors[:2]
    else:
        generator = getattr(data, "generator", None)
        state = generator.get_state() if isinstance(generator, torch.Generator) else None
        try:
            with torch.random.fork_rng(devices=[]):
                batch = next(iter(data), None)
        finally:
            if state is not None:
                generator.set_state(state)
        if batch is None:
            raise ValueError(f"data yielded no batches: {EMPTY_HINT}")
    inputs, targets = check_pair(family_of(model), batch, task, "data")
    check_batch(limits, inputs, targets, task)


def _trainer(overrides: dict[str, Any] | None):
    from omegaconf import OmegaConf

    from glmc.config import TrainerConfig
    from glmc.pipeline.targets import target_problems
    from glmc.train.trainer import trainer_factory

    cfg = OmegaConf.structured(TrainerConfig(accelerator="auto"))
    OmegaConf.set_struct(cfg, True)
    cfg.merge_with(overrides or {})  # a misspelled Trainer setting fails here, naming it
    problems = target_problems(OmegaConf.create({"trainer": cfg}))  # the run config's allow-list
    if problems:
        raise ValueError("trainer: " + "; ".join(problems))
    return trainer_factory(cfg)


def evaluate_tasks(
    model_a: torch.nn.Module | Alignment,
    model_b: torch.nn.Module | None,
    tasks: Sequence[str],
    tokenizer: Any,
    lambdas: Sequence[float] = (0.0, 0.5, 1.0),
    max_length: int | None = None,
    limit: int | None = None,
    circuits: Sequence[str] = (),
    batch_size: int = 32,
    task_folder: str | Path | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """lm-evaluation-harness's `tasks` (names lm-eval knows, glmc's own pydoc_next_chars and
    pydoc_topic_choice, or task YAML files) at every point of lam * A + (1 - lam) * B (an Alignment as A:
    its own parameterisation and circuits) and at both ends' own models: each task metric's curve,
    standard errors and barrier (glmc.eval.tasks), and under "endpoints" A's and B's scores.
    `tokenizer`: glmc's or a Hugging Face tokenizer; `max_length`: the longest window the models read
    (else their config's positions); `limit`: examples per task; `task_folder`: where glmc's own tasks
    are written (else a folder of the user's under the temporary directory)."""
    from glmc.data.text import HFTokenizer
    from glmc.eval.tasks import TaskSuite, path_scores

    path_reference(model_a, model_b)
    alignment = model_a if isinstance(model_a, Alignment) else Alignment(model_a, model_b, circuits=tuple(circuits))
    if not hasattr(tokenizer, "decode") or hasattr(tokenizer, "all_special_ids"):  # a Hugging Face tokenizer
        tokenizer = HFTokenizer(tokenizer)
    length = max_length or _positions(alignment.reference)
    # glmc's own tasks: one folder per user, rewritten only where the files changed
    folder = Path(task_folder or Path(tempfile.gettempdir()) / f"glmc-lm-eval-tasks-{os.getuid()}")
    suite = TaskSuite(list(tasks), folder, limit, batch_size)
    lambdas = _evaluator.checked_lambdas(lambdas)
    record = path_scores(suite, alignment, lambdas, tokenizer, length, desc="tasks", progress=progress)
    record["endpoints"] = {
        "A": suite.score(alignment.reference, tokenizer, length),
        "B": suite.score(alignment.model, tokenizer, length),
    }
    return record


def _positions(model: torch.nn.Module) -> int:
    """How many positions a model reads, from its config."""
    config = getattr(model, "config", None)
    for key in ("n_positions", "max_position_embeddings", "max_seq_len", "n_ctx"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    raise ValueError("max_length: the model's config names no number of positions; pass max_length")
