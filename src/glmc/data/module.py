"""One LightningDataModule for every dataset; the dataset registry (glmc.datasets) gives the loader."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, Subset

from glmc import datasets
from glmc.config import DataConfig
from glmc.data.device_batches import DeviceBatches, Positions, token_windows
from glmc.data.step_sampler import StepSampler


@dataclass
class Splits:
    """A dataset's splits; `val` is None where it has none (the validation loop then watches test)."""

    train: Dataset
    test: Dataset
    val: Dataset | None = None
    tokenizer: Any = None


def load_splits(cfg: DataConfig) -> Splits:
    """The splits of data.name, by the loader its registry entry (glmc.datasets) names."""
    info = datasets.dataset(cfg.name)
    loaded = info.loader(cfg)
    if info.is_text:
        train, val, test, tokenizer = loaded
        return Splits(train, test, val, tokenizer)
    return Splits(*loaded)


def _limit(dataset: Dataset, n: int | None) -> Dataset:
    return dataset if n is None else Subset(dataset, range(min(n, len(dataset))))


def _fixed_masks(dataset: Dataset, cfg: DataConfig) -> Dataset:
    """Masked-LM training windows with masks drawn once (data.mask_seed): every λ sees the same inputs."""
    if isinstance(dataset, Subset):
        return Subset(_fixed_masks(dataset.dataset, cfg), dataset.indices)
    if not hasattr(dataset, "with_fixed_masks"):
        return dataset
    from glmc.data.masked_lm import split_mask_seed

    return dataset.with_fixed_masks(split_mask_seed(cfg.mask_seed, "train"))


# workers of a loader feeding a GPU where data.num_workers is 0 (enough to quiet Lightning's warning)
CUDA_WORKERS = 4


class DataModule(L.LightningDataModule):
    """Train loader shuffled by a generator seeded from the endpoint seed (or resumed from
    `train_generator_state`, or positioned at `train_start_step`); test loader fixed. On one CUDA
    device a text dataset's windows are batched on the device (glmc.data.device_batches)."""

    def __init__(self, cfg: DataConfig, seed: int = 0):
        super().__init__()
        self.cfg = cfg
        self.seed = seed
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self.test_set: Dataset | None = None
        self.tokenizer = None
        # set by a resumed run: the shuffling generator's state where the interrupted run stopped
        self.train_generator_state: torch.Tensor | None = None
        # set by learned matching: the training order is a function of the step, starting at this one
        self.train_start_step: int | None = None
        # batches sliced on the device: None on one CUDA device, True on any one-process trainer, False never
        self.device_batches: bool | None = None
        # where training runs when no trainer is attached: an ensemble's members, whose loaders its trainer
        # iterates (glmc.pipeline.ensemble); and the windows already there, which they share
        self.training_device: torch.device | None = None
        self.device_windows: torch.Tensor | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is None:
            splits = load_splits(self.cfg)
            self.train_set = _limit(splits.train, self.cfg.limit_train)
            self.test_set = _limit(splits.test, self.cfg.limit_test)
            self.val_set = None if splits.val is None else _limit(splits.val, self.cfg.limit_test)
            self.tokenizer = splits.tokenizer

    @property
    def has_validation_split(self) -> bool:
        return self.val_set is not None

    @property
    def vocab_size(self) -> int | None:
        return None if self.tokenizer is None else self.tokenizer.vocab_size

    def train_dataloader(self) -> DataLoader | DeviceBatches:
        device = self._batch_device()
        windows = None if device is None else self.device_windows
        if device is not None and windows is None:
            windows = token_windows(self.train_set)
        if windows is not None:  # the positions drawn as the windows' own loader draws them
            return DeviceBatches(windows, self._train_loader(Positions(len(self.train_set)), {}), device)
        return self._train_loader(self.train_set, self._loader_options(train=True))

    def _train_loader(self, dataset: Dataset, options: dict[str, Any]) -> DataLoader:
        drop_last = len(dataset) > self.cfg.batch_size
        if self.train_start_step is not None:
            # the same order as below, positioned by the step (glmc.data.step_sampler)
            sampler = StepSampler(len(dataset), self.seed, self.cfg.batch_size, drop_last, self.train_start_step)
            return DataLoader(dataset, batch_size=self.cfg.batch_size, sampler=sampler, drop_last=drop_last, **options)
        generator = torch.Generator().manual_seed(self.seed)
        if self.train_generator_state is not None:
            generator.set_state(self.train_generator_state)
        return DataLoader(
            dataset, batch_size=self.cfg.batch_size, shuffle=True, generator=generator, drop_last=drop_last, **options
        )

    def _training_device(self) -> tuple[torch.device | None, int]:
        """The device and number of processes of the trainer this module is attached to; without one,
        (training_device, 1)."""
        if self.trainer is None:
            return self.training_device, 1
        return self.trainer.strategy.root_device, self.trainer.world_size

    def _batch_device(self) -> torch.device | None:
        """Where training batches are sliced from the windows, None for a DataLoader (always so across processes)."""
        device, processes = self._training_device()
        if self.device_batches is False or processes > 1:
            return None
        if self.device_batches:
            return device or torch.device("cpu")
        return device if device is not None and device.type == "cuda" else None

    def _loader_options(self, train: bool) -> dict[str, Any]:
        """data.num_workers; on a CUDA trainer's own loader also pinned batches, and workers where none are set
        and a fetch draws nothing at random (not for an ensemble's members: it stacks their batches)."""
        options: dict[str, Any] = {"num_workers": self.cfg.num_workers}
        device = None if self.trainer is None else self._training_device()[0]
        if device is None or device.type != "cuda":
            return options
        options["pin_memory"] = True
        drawn = train and (self.cfg.augment or self.cfg.task == "masked_lm")
        if self.cfg.num_workers == 0 and not drawn:
            from lightning.fabric.utilities.data import suggested_max_num_workers

            workers = min(CUDA_WORKERS, suggested_max_num_workers(1))
            options.update(num_workers=workers, persistent_workers=workers > 0)
        return options

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.test_set, batch_size=self.cfg.eval_batch_size, num_workers=self.cfg.num_workers)

    def val_dataloader(self) -> DataLoader:
        val = self.test_set if self.val_set is None else self.val_set
        return DataLoader(val, batch_size=self.cfg.eval_batch_size, **self._loader_options(train=False))

    def eval_dataloader(self, split: str) -> DataLoader:
        """A fixed-order loader of `split` (test or train), without augmentation and with fixed masks."""
        if split == "test":
            return self.test_dataloader()
        if split != "train":
            raise ValueError(f"eval.split={split!r} is not one of test, train")
        train = self.train_set
        if self.cfg.augment:
            plain = copy.deepcopy(self.cfg)
            plain.augment = False
            train = _limit(load_splits(plain).train, self.cfg.limit_train)
        train = _fixed_masks(train, self.cfg)
        return DataLoader(train, batch_size=self.cfg.eval_batch_size, num_workers=self.cfg.num_workers)
