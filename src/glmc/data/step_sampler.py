"""A shuffling sampler whose order is a function of the optimisation step alone: every epoch is shuffled by
a generator seeded from (seed, epoch), and the first starts at the batch step `start_step` trains on, so
a run resumed mid-epoch sees the batches the uninterrupted run saw. It advances as batches are drawn.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


class StepSampler(Sampler[int]):
    def __init__(self, n: int, seed: int, batch_size: int, drop_last: bool, start_step: int = 0):
        if n < 1 or batch_size < 1 or start_step < 0:
            raise ValueError(f"StepSampler(n={n}, batch_size={batch_size}, start_step={start_step}): out of range")
        self.n, self.seed, self.batch_size, self.drop_last = n, seed, batch_size, drop_last
        self.batches_per_epoch = n // batch_size if drop_last and n >= batch_size else -(-n // batch_size)
        self.next_step = start_step

    def epoch_order(self, epoch: int) -> list[int]:
        """The order of `epoch` (0-based): a permutation that depends on (seed, epoch) alone."""
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.n, generator=generator).tolist()

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        epoch, position = divmod(self.next_step, self.batches_per_epoch)
        order = self.epoch_order(epoch)
        for batch in range(position, self.batches_per_epoch):
            chunk = order[batch * self.batch_size : (batch + 1) * self.batch_size]
            self.next_step = epoch * self.batches_per_epoch + batch + 1
            yield from chunk
