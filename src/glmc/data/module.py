"""One LightningDataModule for every dataset; the dataset name picks the loader."""

from __future__ import annotations

import copy

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, Subset

from glmc.config import DataConfig


def load_splits(cfg: DataConfig) -> tuple[Dataset, Dataset]:
    if cfg.name == "digits":
        from glmc.data.digits import digits_splits

        return digits_splits(cfg)
    if cfg.name in ("cifar10", "cifar100"):
        from glmc.data.cifar import cifar_splits

        return cifar_splits(cfg)
    if cfg.name == "tiny_imagenet":
        from glmc.data.tiny_imagenet import tiny_imagenet_splits

        return tiny_imagenet_splits(cfg)
    raise ValueError(f"data.name={cfg.name!r} is not a known dataset (digits, cifar10, cifar100, tiny_imagenet)")


def _limit(dataset: Dataset, n: int | None) -> Dataset:
    return dataset if n is None else Subset(dataset, range(min(n, len(dataset))))


class DataModule(L.LightningDataModule):
    """Train loader shuffled by a generator seeded from the endpoint seed; test loader fixed."""

    def __init__(self, cfg: DataConfig, seed: int = 0):
        super().__init__()
        self.cfg = cfg
        self.seed = seed
        self.train_set: Dataset | None = None
        self.test_set: Dataset | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is None:
            train, test = load_splits(self.cfg)
            self.train_set = _limit(train, self.cfg.limit_train)
            self.test_set = _limit(test, self.cfg.limit_test)

    def train_dataloader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(self.seed)
        return DataLoader(
            self.train_set,
            batch_size=self.cfg.batch_size,
            shuffle=True,
            generator=generator,
            num_workers=self.cfg.num_workers,
            drop_last=len(self.train_set) > self.cfg.batch_size,
        )

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.test_set, batch_size=self.cfg.eval_batch_size, num_workers=self.cfg.num_workers)

    val_dataloader = test_dataloader

    def eval_dataloader(self, split: str) -> DataLoader:
        """A fixed-order loader of `split` (test or train) for evaluation: the training split
        without augmentation, in its stored order."""
        if split == "test":
            return self.test_dataloader()
        if split != "train":
            raise ValueError(f"eval.split={split!r} is not one of test, train")
        train = self.train_set
        if self.cfg.augment:
            plain = copy.deepcopy(self.cfg)
            plain.augment = False
            train = _limit(load_splits(plain)[0], self.cfg.limit_train)
        return DataLoader(train, batch_size=self.cfg.eval_batch_size, num_workers=self.cfg.num_workers)
