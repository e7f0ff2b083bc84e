"""sklearn's digits (8x8 grey images, 10 classes): the embedded default, resized once to data.image_size."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import Dataset, TensorDataset

from glmc.config import DataConfig

NATIVE_SIZE = 8


class ShiftedDigits(Dataset):
    """Training images shifted by up to `shift` pixels each way (data.augment=true), background-padded."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, background: float, shift: int = 1):
        self.size = images.shape[-1]
        self.shift = shift
        self.images = F.pad(images, (shift, shift, shift, shift), value=background)
        self.labels = labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        dy, dx = torch.randint(0, 2 * self.shift + 1, (2,)).tolist()  # global RNG: seeded per endpoint
        return self.images[i, :, dy : dy + self.size, dx : dx + self.size], self.labels[i]


def resize(images: np.ndarray, size: int) -> np.ndarray:
    """Bilinear resize of (N, 1, 8, 8) images to (N, 1, size, size); the native size is left as it is."""
    if size == images.shape[-1]:
        return images
    resized = F.interpolate(torch.from_numpy(images), size=(size, size), mode="bilinear", align_corners=False)
    return resized.numpy()


def digits_splits(cfg: DataConfig) -> tuple[Dataset, TensorDataset, TensorDataset | None]:
    """Stratified train/test (and, with `val_fraction` > 0, validation) splits fixed by `split_seed`,
    resized to `image_size` and standardised with the training statistics."""
    images, labels = load_digits(return_X_y=True)
    images = images.astype(np.float32).reshape(-1, 1, NATIVE_SIZE, NATIVE_SIZE)
    size = cfg.image_size or NATIVE_SIZE
    images = resize(images, size)
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=cfg.test_fraction, random_state=cfg.split_seed, stratify=labels
    )
    x_val = y_val = None
    if cfg.val_fraction > 0:
        x_train, x_val, y_train, y_val = train_test_split(
            x_train, y_train, test_size=cfg.val_fraction, random_state=cfg.split_seed, stratify=y_train
        )
    mean, std = x_train.mean(), x_train.std()
    # torch-owned copies, not numpy views: spawned DDP ranks receive them through shared memory
    to_set = lambda x, y: TensorDataset(torch.tensor((x - mean) / std), torch.tensor(y, dtype=torch.long))
    train, test = to_set(x_train, y_train), to_set(x_test, y_test)
    if cfg.augment:
        # one pixel at 8x8, as before; the same share of the image at larger sizes
        train = ShiftedDigits(*train.tensors, background=float(-mean / std), shift=size // 8)
    return train, test, (None if x_val is None else to_set(x_val, y_val))


def digits_content() -> bytes:
    """The images and labels as stored (what the endpoint cache key sums: glmc.data.fingerprint)."""
    digits = load_digits()
    return digits.data.astype("float64").tobytes() + digits.target.astype("int64").tobytes()
