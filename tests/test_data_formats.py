"""Real-dataset loaders read small files that a fixture writes in the released on-disk formats."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from PIL import Image

from glmc.data.module import DataModule

from conftest import compose_config


def write_cifar10(root, n=6):
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), b"labels": list(rng.integers(0, 10, n))}
        with open(folder / name, "wb") as f:
            pickle.dump(batch, f)


def write_tiny_imagenet(root, wnids=("n01", "n02"), per_class=3):
    base = root / "tiny-imagenet-200"
    (base / "val" / "images").mkdir(parents=True)
    (base / "wnids.txt").write_text("\n".join(wnids) + "\n")
    lines = []
    for c, w in enumerate(wnids):
        (base / "train" / w / "images").mkdir(parents=True)
        for i in range(per_class):
            Image.new("RGB", (64, 64), (40 * c, 10 * i, 0)).save(base / "train" / w / "images" / f"{w}_{i}.JPEG")
        Image.new("RGB", (64, 64), (40 * c, 0, 0)).save(base / "val" / "images" / f"val_{c}.JPEG")
        lines.append(f"val_{c}.JPEG\t{w}\t0\t0\t63\t63")
    (base / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")


def test_cifar10_batches(tmp_path):
    write_cifar10(tmp_path)
    cfg = compose_config("data=cifar10", f"data.root={tmp_path}", "data.batch_size=4")
    dm = DataModule(cfg.data, seed=0)
    dm.setup()
    assert len(dm.train_set) == 30 and len(dm.test_set) == 6
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (4, 3, 32, 32) and y.dtype.is_floating_point is False


def test_cifar_missing_files_name_the_path(tmp_path):
    cfg = compose_config("data=cifar100", f"data.root={tmp_path}")
    with pytest.raises(FileNotFoundError, match="cifar-100-python"):
        DataModule(cfg.data).setup()


def test_tiny_imagenet_folders(tmp_path):
    write_tiny_imagenet(tmp_path)
    cfg = compose_config("data=tiny_imagenet", f"data.root={tmp_path}", "data.batch_size=2", "data.augment=false")
    dm = DataModule(cfg.data, seed=0)
    dm.setup()
    assert len(dm.train_set) == 6 and len(dm.test_set) == 2
    x, y = next(iter(dm.test_dataloader()))
    assert x.shape == (2, 3, 64, 64) and y.tolist() == [0, 1]


def test_digits_augmentation_shifts_within_one_pixel():
    import torch

    cfg = compose_config("data.augment=true")
    dm = DataModule(cfg.data, seed=0)
    dm.setup()
    x, y = dm.train_set[0]
    assert x.shape == (1, 8, 8)
    base = dm.train_set.images[0]  # padded to 10x10
    assert any(torch.equal(x[0], base[0, dy : dy + 8, dx : dx + 8]) for dy in range(3) for dx in range(3))
