"""Tiny ImageNet (200 classes, 64x64) in its released folder layout; the val split serves as test."""

from __future__ import annotations

from pathlib import Path

from PIL import Image
from torch.utils.data import Dataset
from torchvision import transforms

from glmc.config import DataConfig

MEAN, STD = (0.480, 0.448, 0.398), (0.277, 0.269, 0.282)


class ImageFiles(Dataset):
    def __init__(self, items: list[tuple[Path, int]], transform):
        self.items, self.transform = items, transform

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        path, label = self.items[i]
        with Image.open(path) as image:
            return self.transform(image.convert("RGB")), label


def tiny_imagenet_splits(cfg: DataConfig) -> tuple[Dataset, Dataset]:
    base = Path(cfg.root) / "tiny-imagenet-200"
    wnids_file = base / "wnids.txt"
    if not wnids_file.exists():
        raise FileNotFoundError(f"{wnids_file} is missing: set data.root to the folder holding tiny-imagenet-200/")
    wnids = wnids_file.read_text().split()
    index = {w: i for i, w in enumerate(wnids)}
    train_items = [(p, index[w]) for w in wnids for p in sorted((base / "train" / w / "images").glob("*.JPEG"))]
    test_items = []
    for line in (base / "val" / "val_annotations.txt").read_text().splitlines():
        name, wnid = line.split("\t")[:2]
        test_items.append((base / "val" / "images" / name, index[wnid]))
    to_tensor = [transforms.ToTensor(), transforms.Normalize(MEAN, STD)]
    policy = transforms.AutoAugmentPolicy.IMAGENET
    augment = [transforms.RandomResizedCrop(64), transforms.RandomHorizontalFlip(), transforms.AutoAugment(policy)]
    train_tf = transforms.Compose((augment if cfg.augment else []) + to_tensor)
    return ImageFiles(train_items, train_tf), ImageFiles(test_items, transforms.Compose(to_tensor))
