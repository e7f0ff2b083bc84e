"""Linear warm-up and cosine decay per optimisation step, below both endpoint training and learned matching."""

from __future__ import annotations

import math

import torch


def warmup_cosine(optimizer: torch.optim.Optimizer, total_steps: int, warmup_fraction: float):
    warmup = max(1, int(round(warmup_fraction * total_steps)))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total_steps - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
