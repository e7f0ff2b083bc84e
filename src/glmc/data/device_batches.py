"""Training batches of fixed token windows, sliced from one tensor copied to the training device once.

The positions come from a DataLoader of 0..n-1 built like the windows' own loader (sampler, batch size,
drop_last, generator), so a seed gives the same batches, and the same generator state, as that loader.
"""

from __future__ import annotations

import itertools
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
    """The (examples, seq_len) tensor of a TokenWindows set or a Subset of one; None for other datasets."""
    if isinstance(dataset, Subset):
        inner = token_windows(dataset.dataset)
        return None if inner is None else inner[torch.as_tensor(list(dataset.indices), dtype=torch.long)]
    return dataset.windows if type(dataset) is TokenWindows else None


class DeviceBatches:
    """(inputs, targets) batches of `windows` rows in the order of `positions` (a DataLoader of
    Positions); `generator` is the positions loader's, which glmc.train.resume saves."""

    def __init__(self, windows: Tensor, positions: DataLoader, device: torch.device | str):
        self.windows = windows.to(device)
        self.positions = positions

    @property
    def generator(self) -> torch.Generator | None:
        return self.positions.generator

    @property
    def sampler(self):
        """The positions loader's sampler (a step-positioned order's, glmc.data.step_sampler, keeps its place)."""
        return self.positions.sampler

    @property
    def batch_size(self) -> int | None:
        return self.positions.batch_size

    def __len__(self) -> int:
        return len(self.positions)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        # drawn at the first batch (an iterator made and dropped draws nothing), moved in one copy. Only its
        # length's worth, as Lightning takes a loader's batches: exhausting the positions would draw once more
        # (a shuffling sampler draws its next permutation when run past its end), and every later epoch's
        # order would then differ from the loader's
        chunks = list(itertools.islice(self.positions, len(self.positions)))
        if not chunks:
            return
        order = torch.cat(chunks).to(self.windows.device, non_blocking=True)
        for rows in order.split([len(c) for c in chunks]):
            batch = self.windows.index_select(0, rows)
            yield batch, batch
