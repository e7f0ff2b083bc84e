"""What glmc.api accepts, checked where it enters: models, tasks and batches; each refusal names the argument."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import replace
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from glmc.alignment import Alignment
from glmc.datasets import CAUSAL_LM, CLASSIFICATION, IMAGES, MASKED_LM, TEXT
from glmc.metrics import is_token_task
from glmc.models.canonical import CanonicalTransformer
from glmc.models.families import family_named, family_of_model_type
from glmc.safe_files import unwritable

if TYPE_CHECKING:
    from glmc.models.families.base import Family

TASKS = (CLASSIFICATION, CAUSAL_LM, MASKED_LM)  # data.task's values
PARALLEL_WRAPPERS = (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)
# a family's data kind -> (axes of its inputs, what they are)
INPUT_FORMS = {
    TEXT: (2, "integer token ids [batch, time]"),
    IMAGES: (4, "float images [batch, channels, height, width]"),
}


def check_model(model: Any, name: str) -> None:
    """TypeError for anything but a module with its family's head, or for one wrapped for parallel training
    (DataParallel, DistributedDataParallel); ValueError for weights on the meta device."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(
            f"{name} is a {type(model).__name__}, not a torch.nn.Module: pass a Hugging Face model of a known "
            "family or a canonical one (glmc.to_canonical)"
        )
    if isinstance(model, PARALLEL_WRAPPERS):
        # the wrapper hides the model's config and prefixes its weights' names with "module."
        raise TypeError(
            f"{name} is a {type(model).__name__} around a {type(model.module).__name__}: pass {name}.module, the "
            "model itself (glmc reads its weights and places them on `device` itself)"
        )
    _check_head(model, name)
    tensors = chain(model.named_parameters(), model.named_buffers())
    meta = next((key for key, t in tensors if t.is_meta), None)
    if meta is not None:
        raise ValueError(
            f"{name} has its weights on the meta device ({meta} holds no data; built under torch.device('meta') "
            "or init_empty_weights?): pass a model with its weights loaded, e.g. from_pretrained(path), or "
            "model.to_empty(device='cpu') followed by model.load_state_dict(state_dict)"
        )


def _check_head(model: torch.nn.Module, name: str) -> None:
    family = None if isinstance(model, CanonicalTransformer) else family_of(model)
    if family is None or any(c.__name__ in family.hf_classes for c in type(model).__mro__):
        return
    given, classes = type(model).__name__, " or ".join(family.hf_classes)
    if getattr(model, "base_model", None) is model:  # HF: a model with a head holds its body as base_model
        raise TypeError(
            f"{name} is a {given}, the bare {family.name} body without its head (it returns hidden states, not "
            f"logits): pass the model with its head, {classes} (e.g. {family.hf_classes[0]}.from_pretrained(path) "
            f"rather than {given}.from_pretrained(path))"
        )
    raise TypeError(f"{name} is a {given}, a head the {family.name} family does not read: pass {classes}")


def family_of(model: Any) -> Family | None:
    """The family of a canonical or Hugging Face model, None for a model of no known family."""
    if isinstance(model, CanonicalTransformer):
        return family_named(model.config.family)
    try:
        return family_of_model_type(getattr(getattr(model, "config", None), "model_type", None))
    except ValueError:
        return None


def model_task(model: Any) -> str | None:
    """The task `model` is built for (its own, its family's one, or its head's), or None."""
    if isinstance(model, CanonicalTransformer):
        return model.task
    family = family_of(model)
    if family is None:
        return None
    if family.task_heads and hasattr(family, "head_of"):
        try:
            return family.task_heads[family.head_of(model)]
        except TypeError:  # an HF class the family does not convert
            return None
    return family.tasks[0] if len(family.tasks) == 1 else None


def resolve_task(model: Any, task: str | None, name: str = "model") -> str:
    """`task` checked against model `name`, or its own task (else "classification") when None."""
    expected = model_task(model)
    if task is None:
        return expected or "classification"
    if task not in TASKS:
        raise ValueError(f"task={task!r} is not one of {list(TASKS)}")
    if expected is not None and task != expected:
        raise ValueError(
            f"task={task!r} does not fit {name}, a {type(model).__name__} built for {expected}: pass "
            f"task={expected!r} or leave task out (it is read from the model)"
        )
    return task


def path_reference(model_a: Any, model_b: Any) -> torch.nn.Module:
    """The end a path's batches are checked against, after checking both ends."""
    if isinstance(model_a, Alignment):
        check_model(model_a.reference, "model_a.reference")
        check_model(model_a.model, "model_a.model")
        return model_a.reference
    check_model(model_a, "model_a")
    if model_b is None:
        raise TypeError("model_b is None: pass model B, or an Alignment as model_a (and None for model_b)")
    check_model(model_b, "model_b")
    return model_a


def untied_ends(model_a: Any, model_b: Any) -> tuple[Any, Any]:
    """A path's ends (an Alignment and None, or two models) where one end is an original model with its output
    head tied to its embedding and the other is not: the tied one replaced by an untied copy, its other
    tensors shared (not copied), so both hold the same parameters, as run.py pairs such models
    (glmc.pipeline.hf_folders.untie_mixed_heads). The models passed in are left as they are."""
    if isinstance(model_a, Alignment):
        reference, model = untied_ends(model_a.reference, model_a.model)
        return replace(model_a, reference=reference, model=model), None
    from glmc.pipeline.hf_folders import head_is_tied  # the pipeline's: imported where a path is evaluated

    ends = (model_a, model_b)
    if not all(hasattr(m, "get_output_embeddings") for m in ends):  # canonical heads are never tied
        return model_a, model_b
    tied = [head_is_tied(m) for m in ends]
    if all(tied) or not any(tied):
        return model_a, model_b
    return _untied_copy(model_a) if tied[0] else model_a, _untied_copy(model_b) if tied[1] else model_b


def _untied_copy(model: torch.nn.Module) -> torch.nn.Module:
    from glmc.pipeline.hf_folders import untie_output_head

    shared = {id(t): t for t in chain(model.parameters(), model.buffers())}  # deepcopy takes these as copied
    copied = copy.deepcopy(model, memo=shared)
    untie_output_head(copied)
    return copied


def check_loader(loader: Any, name: str) -> None:
    """TypeError for a `loader` that cannot yield batches (one batch passed alone, a tensor, None)."""
    if isinstance(loader, (torch.Tensor, Mapping)) or not isinstance(loader, Iterable):
        raise TypeError(
            f"{name} is a {type(loader).__name__}: pass an iterable of (inputs, targets) batches, e.g. a "
            "DataLoader or [(inputs, targets)]"
        )


def check_run_dir(run_dir: Any) -> None:
    """ValueError naming `run_dir` where the folder cannot be created or written (a file on its path, a link
    loop, no permission); None (a temporary folder) passes."""
    if run_dir is None:
        return
    path = Path(run_dir)
    kind, existing, reason = unwritable(path) or ("", path, "")
    key = f"run_dir={str(run_dir)!r}"
    instead = "pass run_dir=<a folder to write in>, or leave it None (a temporary one)"
    if kind == "file":
        what = "is a file" if existing == path else f"cannot be created: {existing} is a file"
        raise ValueError(f"{key} {what}, not a folder: {instead}")
    if kind == "loop":
        raise ValueError(f"{key}: a symbolic link on this path leads back to itself (a loop): {instead}")
    if kind == "denied":
        what = "is not writable" if existing == path else f"cannot be created in {existing}"
        raise ValueError(f"{key} {what} ({reason}): {instead}")


def check_pair(family: Family | None, batch: Any, task: str, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch that `name` yields, as (inputs, targets) checked against what `family` reads (None: not
    checked) and `task` compares: TypeError for another kind of batch or tensor, ValueError for a shape."""
    if isinstance(batch, Mapping):
        raise TypeError(
            f"{name} yields dicts (keys {list(batch)}): yield (inputs, targets) pairs, e.g. "
            "(batch['input_ids'], batch['labels'])"
        )
    if not isinstance(batch, (tuple, list)) or len(batch) != 2:
        what = f"{len(batch)}-element {type(batch).__name__}s" if isinstance(batch, (tuple, list)) else None
        raise TypeError(
            f"{name} yields {what or type(batch).__name__ + ' batches'}: each batch must be an (inputs, targets) "
            "pair (a single batch goes in a list: [(inputs, targets)])"
        )
    inputs, targets = batch
    for what, t in (("inputs", inputs), ("targets", targets)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}'s {what} are a {type(t).__name__}, not a torch.Tensor")
    if family is not None:
        _check_inputs(family, inputs, name)
    if inputs.dim() == 0:
        raise ValueError(f"{name}'s inputs are a single number: batches have a leading batch axis")
    _check_targets(inputs, targets, task, name)
    return inputs, targets


def _check_inputs(family: Family, inputs: torch.Tensor, name: str) -> None:
    axes, form = INPUT_FORMS[family.data_kind]
    text = family.data_kind == TEXT
    if (inputs.is_floating_point() or inputs.is_complex() or inputs.dtype == torch.bool) == text:
        raise TypeError(
            f"{name}'s inputs are {inputs.dtype} of shape {tuple(inputs.shape)}, but a {family.name} model reads "
            f"{form}" + (": tokenize the text with the model's tokenizer" if text else "")
        )
    if inputs.dim() != axes:
        hint = ": one sequence goes in as inputs[None]; merge or drop the extra axes" if text else ""
        raise ValueError(
            f"{name}'s inputs have shape {tuple(inputs.shape)} ({inputs.dim()} axes), but a {family.name} "
            f"model reads {form} ({axes} axes){hint}"
        )


def _check_targets(inputs: torch.Tensor, targets: torch.Tensor, task: str, name: str) -> None:
    if targets.is_floating_point() or targets.is_complex() or targets.dtype == torch.bool:
        raise TypeError(
            f"{name}'s targets are {targets.dtype}: pass integer {'token ids' if is_token_task(task) else 'labels'}"
        )
    shape, got = tuple(inputs.shape), tuple(targets.shape)
    if is_token_task(task) and got != shape:
        raise ValueError(
            f"{name}'s targets of shape {got} do not fit inputs of shape {shape}: for task={task!r} the targets "
            "hold a token id for every input position, shaped like the inputs [batch, time] (-100 where "
            "nothing counts)"
        )
    if not is_token_task(task) and got != shape[:1]:
        hint = (
            ": targets shaped like the inputs are per-token, for task='causal_lm' or 'masked_lm'"
            if got == shape
            else ""
        )
        raise ValueError(
            f"{name}'s targets of shape {got} do not fit inputs of shape {shape}: for task={task!r} the targets "
            f"are one label per input, shape [batch] = {shape[:1]}{hint}"
        )
