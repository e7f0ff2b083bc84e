"""Evaluate models, and the straight line between two of them, on a fixed split."""
from __future__ import annotations

import copy
from typing import Iterable, Sequence

import torch
from tqdm.auto import tqdm

from glmc.eval.interpolation import interpolate_state_dicts
from glmc.eval.metrics import logits_of, loss_and_correct


@torch.no_grad()
def evaluate(model: torch.nn.Module, loader: Iterable, task: str = "classification") -> tuple[float, float]:
    """Mean loss and accuracy over the loader."""
    model.eval()
    total_loss, total_correct, total = 0.0, 0, 0
    for inputs, targets in loader:
        loss, correct, count = loss_and_correct(logits_of(model, inputs), targets, task)
        total_loss += float(loss)
        total_correct += int(correct)
        total += count
    return total_loss / total, total_correct / total


def evaluate_path(
    model_a: torch.nn.Module,
    model_b: torch.nn.Module,
    loader: Iterable,
    lambdas: Sequence[float],
    task: str = "classification",
    desc: str = "path",
    progress: bool = True,
) -> dict[str, list[float]]:
    """Loss and accuracy of lam*A + (1-lam)*B for every lam; one model instance is reused."""
    sd_a, sd_b = model_a.state_dict(), model_b.state_dict()
    probe = copy.deepcopy(model_a)
    curve = {"lambdas": [float(x) for x in lambdas], "loss": [], "accuracy": []}
    for lam in tqdm(lambdas, desc=desc, disable=not progress, leave=False):
        probe.load_state_dict(interpolate_state_dicts([sd_a, sd_b], [lam, 1.0 - lam]))
        loss, acc = evaluate(probe, loader, task)
        curve["loss"].append(loss)
        curve["accuracy"].append(acc)
    return curve
