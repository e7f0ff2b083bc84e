"""CIFAR-10/100 from the python-pickle batches of the official archives, read directly (torchvision's
checksum rejects small test files) by `BatchUnpickler`, which admits only numpy arrays: a planted file
cannot run code.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset
from torchvision import transforms

from glmc.config import DataConfig
from glmc.data.download import fetching

# data.name -> (folder under data.root, training and test batch files, label key, torchvision class)
LAYOUT = {
    "cifar10": ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"], b"labels", "CIFAR10"),
    "cifar100": ("cifar-100-python", ["train"], ["test"], b"fine_labels", "CIFAR100"),
}
MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


# (module, name) pairs that numpy arrays and scalars pickle to, under numpy 1.x and 2.x names, at
# protocols 2 (the release files) to 5; plain containers (dict, list, bytes) need no globals.
_ALLOWED = {
    (module, name)
    for core in ("numpy.core", "numpy._core")
    for module, name in (
        (f"{core}.multiarray", "_reconstruct"),
        (f"{core}.multiarray", "scalar"),
        (f"{core}.numeric", "_frombuffer"),
    )
} | {
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),  # how protocol 2 writes bytes from Python 3
}


class BatchUnpickler(pickle.Unpickler):
    """Unpickler for CIFAR batches: any global outside `_ALLOWED` is refused, naming the file."""

    def __init__(self, file, path: Path):
        super().__init__(file, encoding="bytes")  # the release format: dicts of numpy arrays, bytes keys
        self.path = path

    def find_class(self, module: str, name: str):
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(
                f"{self.path} is not a CIFAR batch: it asks to load {module}.{name}, and only numpy arrays "
                "and plain containers are accepted (the file may have been tampered with; replace it)"
            )
        return super().find_class(module, name)


def load_batch(path: Path) -> dict:
    with open(path, "rb") as f:
        return BatchUnpickler(f, path).load()


def _read_batches(folder: Path, names: list[str], label_key: bytes) -> tuple[np.ndarray, np.ndarray]:
    images, labels = [], []
    for name in names:
        path = folder / name
        if not path.exists():
            raise FileNotFoundError(
                f"{path} is missing: set data.root to the folder holding {folder.name}/ "
                "or data.download=true on a machine with network"
            )
        batch = load_batch(path)
        if not isinstance(batch, dict) or b"data" not in batch or label_key not in batch:
            raise ValueError(f"{path} is not a CIFAR batch: expected a dict with b'data' and {label_key!r}")
        images.append(np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
        labels.append(np.asarray(batch[label_key], dtype=np.int64))
    return np.concatenate(images), np.concatenate(labels)


class ArrayImages(Dataset):
    def __init__(self, images: np.ndarray, labels: np.ndarray, transform):
        self.images, self.labels, self.transform = images, labels, transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        image = torch.from_numpy(self.images[i]).float().div(255.0)
        return self.transform(image), int(self.labels[i])


def cifar_splits(cfg: DataConfig) -> tuple[Dataset, Dataset]:
    folder_name, train_names, test_names, label_key, release = LAYOUT[cfg.name]
    root = Path(cfg.root)
    if cfg.download and not (root / folder_name).exists():
        from torchvision import datasets

        dataset = getattr(datasets, release)
        instead = (
            f"extract {dataset.filename} so that {root / folder_name} exists (data.root={cfg.root}) "
            "and set data.download=false"
        )
        with fetching(cfg.name.upper().replace("CIFAR", "CIFAR-"), dataset.url, instead):
            dataset(root, download=True)
    normalise = transforms.Normalize(MEAN, STD)
    train_tf = normalise
    if cfg.augment:  # paper 001 Table 3: crop with padding, flip, colour jitter
        train_tf = transforms.Compose(
            [
                transforms.RandomCrop(32, padding=4),
                transforms.RandomHorizontalFlip(),
                transforms.ColorJitter(0.4, 0.4, 0.4, 0.1),
                normalise,
            ]
        )
    train = ArrayImages(*_read_batches(root / folder_name, train_names, label_key), train_tf)
    test = ArrayImages(*_read_batches(root / folder_name, test_names, label_key), normalise)
    return train, test
