"""Training batches of fixed token windows, sliced from one tensor on the training device.

A text dataset's training windows (glmc.data.text.TokenWindows) are one (windows, seq_len) tensor, and a
window is its own target. Training on a GPU, `DeviceBatches` copies that tensor to the device once and
takes every batch there by index, instead of a DataLoader fetching each window, collating the batch on
the host and copying it over at every step.

The order is the DataLoader's own: the positions come from a DataLoader of the positions 0..n-1 built
with the training loader's sampler, batch size, drop_last and generator, which draws from its generator
exactly as the loader of the windows does. The same seed therefore gives the same batches in the same
order, and the generator's state after an epoch (what glmc.train.resume saves) is the same.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Subset

from glmc.data.text import TokenWindows


class Positions(Dataset):
    """The positions 0..n-1 of a dataset of n examples."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def token_windows(dataset: Dataset) -> Tensor | None:
    """The (examples, seq_len) tensor of a TokenWindows set or of a Subset of one, row i being example
    i; None for any other dataset (masked-LM windows draw masks at every fetch: they keep the loader)."""
    if isinstance(dataset, Subset):
        inner = token_windows(dataset.dataset)
        return None if inner is None else inner[torch.as_tensor(list(dataset.indices), dtype=torch.long)]
    return dataset.windows if type(dataset) is TokenWindows else None


class DeviceBatches:
    """(inputs, targets) batches of `windows` rows in the order of `positions` (a DataLoader of
    Positions), the rows copied to `device` once; inputs and targets are one tensor, as a window is its
    own target. `generator` is the positions loader's, which glmc.train.resume saves and restores."""

    def __init__(self, windows: Tensor, positions: DataLoader, device: torch.device | str):
        self.windows = windows.to(device)
        self.positions = positions

    @property
    def generator(self) -> torch.Generator | None:
        return self.positions.generator

    @property
    def batch_size(self) -> int | None:
        return self.positions.batch_size

    def __len__(self) -> int:
        return len(self.positions)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        # the epoch's positions drawn when the first batch is asked for (an iterator made and dropped
        # draws nothing), then moved to the device in one copy
        chunks = list(self.positions)
        if not chunks:
            return
        order = torch.cat(chunks).to(self.windows.device, non_blocking=True)
        for rows in order.split([len(c) for c in chunks]):
            batch = self.windows.index_select(0, rows)
            yield batch, batch
