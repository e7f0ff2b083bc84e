"""Loss and accuracy of logits against a batch, for image classification and causal language models."""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100  # padding targets (cross_entropy's default ignore_index)


def logits_of(model: torch.nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    """HF models return an output object, canonical models a tensor; both take the same input."""
    out = model(inputs)
    return out.logits if hasattr(out, "logits") else out


def loss_and_correct(
    logits: torch.Tensor, targets: torch.Tensor, task: str
) -> tuple[torch.Tensor, torch.Tensor, int | torch.Tensor]:
    """Summed loss, number of correct predictions and number of predictions in the batch.
    Causal LM: token t+1 predicted from the prefix up to t; target id -100 (padding) is not counted."""
    if task == "causal_lm":
        logits, targets = logits[:, :-1].flatten(0, 1), targets[:, 1:].flatten()
        counted = targets != IGNORE_INDEX
        loss = F.cross_entropy(logits, targets, reduction="sum", ignore_index=IGNORE_INDEX)
        correct = ((logits.argmax(-1) == targets) & counted).sum()
        return loss, correct, counted.sum()  # a tensor: no device sync per batch
    loss = F.cross_entropy(logits, targets, reduction="sum")
    correct = (logits.argmax(-1) == targets).sum()
    return loss, correct, targets.numel()
