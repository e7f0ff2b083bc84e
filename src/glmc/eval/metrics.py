"""Loss and accuracy of logits against a batch, for image classification and causal language models."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def logits_of(model: torch.nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    """HF models return an output object, canonical models a tensor; both take the same input."""
    out = model(inputs)
    return out.logits if hasattr(out, "logits") else out


def loss_and_correct(logits: torch.Tensor, targets: torch.Tensor, task: str) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Summed loss, number of correct predictions and number of predictions in the batch."""
    if task == "causal_lm":  # predict token t+1 from the prefix up to t
        logits, targets = logits[:, :-1].flatten(0, 1), targets[:, 1:].flatten()
    loss = F.cross_entropy(logits, targets, reduction="sum")
    correct = (logits.argmax(-1) == targets).sum()
    return loss, correct, targets.numel()
