"""Stage 3, evaluation: the run's evaluators (the test split's and the paths') and one aligned pair's path
scored by them, with its barriers and the end checks of a function-preserving path."""

from __future__ import annotations

import math
from typing import Any

import torch

from glmc.alignment import Alignment
from glmc.config import Config
from glmc.data.module import DataModule
from glmc.eval.barrier import barrier, barrier_vs_mean, path_end_mismatches
from glmc.eval.evaluator import Evaluator
from glmc.metrics import is_token_task
from glmc.models.canonical import relative_deviation
from glmc.pipeline.endpoint_record import Endpoint


def evaluators(cfg: Config, data: DataModule, device: torch.device) -> tuple[Evaluator, Evaluator]:
    """The test split's evaluator and the one the paths are evaluated with (the same unless eval.split
    names another split)."""
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


def evaluate_alignment(
    evaluator: Evaluator,
    alignment: Alignment,
    b: Endpoint,
    lambdas: list[float],
    task: str,
    desc: str,
    end_losses: tuple[float, float] | None = None,
    endpoint_models: bool = False,
) -> dict[str, Any]:
    """The path's curve, barriers and how far the aligned B is from B (relative logit deviation).

    `end_losses` (A's and B's own losses on the evaluator's batches): a function-preserving path must
    start and end at them; a mismatch above float32 round-off is an error naming both values.
    `endpoint_models`: whether the run sets endpoint_models, which the error then names as a suspect."""
    curve = evaluator.path(alignment, lambdas, desc=desc)
    if end_losses is not None and alignment.function_preserving:
        mismatches = path_end_mismatches(lambdas, curve["loss"], *end_losses)
        if mismatches:
            suspect = " (a model setting of endpoint_models beyond the widths?)" if endpoint_models else ""
            raise ValueError(
                f"{desc}: the path does not end at its endpoints ({'; '.join(mismatches)}): the interpolated "
                f"model computes another function than the endpoint: a setting of B's forward taken from A{suspect}"
            )
    return {
        "barrier": barrier(lambdas, curve["loss"]),
        "barrier_vs_mean": barrier_vs_mean(lambdas, curve["loss"]),
        "lambdas": lambdas,
        "test_loss": curve["loss"],
        "test_accuracy": curve["accuracy"] if task == "classification" else [None] * len(lambdas),
        **({"test_perplexity": [math.exp(x) for x in curve["loss"]]} if is_token_task(task) else {}),
        "endpoint_deviation": relative_deviation(evaluator.logits(alignment.model), evaluator.logits(b.model)),
        "function_preserving": alignment.function_preserving,
    }
