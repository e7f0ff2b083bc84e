"""sklearn's digits (8x8 grey images, 10 classes): the embedded default, no download."""
from __future__ import annotations

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import TensorDataset

from glmc.config import DataConfig


def digits_splits(cfg: DataConfig) -> tuple[TensorDataset, TensorDataset]:
    """Stratified train/test split fixed by `split_seed`, standardised with train statistics."""
    images, labels = load_digits(return_X_y=True)
    images = images.astype(np.float32).reshape(-1, 1, 8, 8)
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=cfg.test_fraction, random_state=cfg.split_seed, stratify=labels
    )
    mean, std = x_train.mean(), x_train.std()
    to_set = lambda x, y: TensorDataset(torch.from_numpy((x - mean) / std), torch.from_numpy(y).long())
    return to_set(x_train, y_train), to_set(x_test, y_test)
