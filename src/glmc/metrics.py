"""Loss and accuracy of logits against a batch, for image classification, causal and masked language
models."""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100  # padding targets (cross_entropy's default ignore_index)

# tasks whose logits and targets have one entry per token: target IGNORE_INDEX marks one no loss counts
TOKEN_TASKS = ("causal_lm", "masked_lm")


def is_token_task(task: str) -> bool:
    """A language-model task: a prediction per token, perplexity = exp(loss) per counted token."""
    return str(task) in TOKEN_TASKS


def logits_of(model: torch.nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    """HF models return an output object, canonical models a tensor; both take the same input."""
    out = model(inputs)
    return out.logits if hasattr(out, "logits") else out


def flat_predictions(logits: torch.Tensor, targets: torch.Tensor, task: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, classes) logits and (N,) targets that the loss compares: causal LM shifted by one (token t+1 from
    the prefix up to t), masked LM every position, classification as given."""
    if task == "causal_lm":
        return logits[:, :-1].flatten(0, 1), targets[:, 1:].flatten()
    if task == "masked_lm":
        return logits.flatten(0, 1), targets.flatten()
    return logits, targets


# a batch's token logits above this size are scored a few examples at a time: the shifted copy and the
# log-softmax of a large vocabulary's logits would otherwise each be as large as the logits
LOSS_CHUNK_BYTES = 16 * 2**20


def loss_and_correct(
    logits: torch.Tensor, targets: torch.Tensor, task: str
) -> tuple[torch.Tensor, torch.Tensor, int | torch.Tensor]:
    """Summed loss, correct predictions and predictions in the batch (IGNORE_INDEX targets not counted)."""
    size = logits.numel() * logits.element_size()
    if is_token_task(task) and size > LOSS_CHUNK_BYTES and len(logits) > 1:
        rows = max(1, LOSS_CHUNK_BYTES * len(logits) // size)
        parts = [_scored(logits[i : i + rows], targets[i : i + rows], task) for i in range(0, len(logits), rows)]
        return sum(p[0] for p in parts), sum(p[1] for p in parts), sum(p[2] for p in parts)
    return _scored(logits, targets, task)


def _scored(
    logits: torch.Tensor, targets: torch.Tensor, task: str
) -> tuple[torch.Tensor, torch.Tensor, int | torch.Tensor]:
    logits, targets = flat_predictions(logits, targets, task)
    if is_token_task(task):
        counted = targets != IGNORE_INDEX
        loss = F.cross_entropy(logits, targets, reduction="sum", ignore_index=IGNORE_INDEX)
        correct = ((logits.argmax(-1) == targets) & counted).sum()
        return loss, correct, counted.sum()  # a tensor: no device sync per batch
    loss = F.cross_entropy(logits, targets, reduction="sum")
    correct = (logits.argmax(-1) == targets).sum()
    return loss, correct, targets.numel()
