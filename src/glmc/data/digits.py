"""sklearn's digits (8x8 grey images, 10 classes): the embedded default, no download."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import Dataset, TensorDataset

from glmc.config import DataConfig


class ShiftedDigits(Dataset):
    """Training images shifted by up to one pixel in each direction (data.augment=true)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, background: float):
        self.images = F.pad(images, (1, 1, 1, 1), value=background)
        self.labels = labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        dy, dx = torch.randint(0, 3, (2,)).tolist()  # global RNG: seeded per endpoint
        return self.images[i, :, dy : dy + 8, dx : dx + 8], self.labels[i]


def digits_splits(cfg: DataConfig) -> tuple[Dataset, TensorDataset]:
    """Stratified train/test split fixed by `split_seed`, standardised with train statistics."""
    images, labels = load_digits(return_X_y=True)
    images = images.astype(np.float32).reshape(-1, 1, 8, 8)
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=cfg.test_fraction, random_state=cfg.split_seed, stratify=labels
    )
    mean, std = x_train.mean(), x_train.std()
    # torch-owned copies, not numpy views: spawned DDP ranks receive them through shared memory
    to_set = lambda x, y: TensorDataset(torch.tensor((x - mean) / std), torch.tensor(y, dtype=torch.long))
    train, test = to_set(x_train, y_train), to_set(x_test, y_test)
    if cfg.augment:
        train = ShiftedDigits(*train.tensors, background=float(-mean / std))
    return train, test
