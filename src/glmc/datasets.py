"""Every dataset glmc reads, one entry each: what it is, what it fits and how it is loaded. The rest of glmc
asks this registry (`dataset(cfg.data.name)`) and never names a dataset (docs/adding-a-dataset.md). It imports
nothing of glmc, so the config schema can read it: loaders and checksums are `Lazy` references into glmc.data."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

IMAGES, TEXT = "images", "text"  # a dataset's modality, as a model family's `data_kind` names it
CLASSIFICATION, CAUSAL_LM, MASKED_LM = "classification", "causal_lm", "masked_lm"  # data.task


@dataclass(frozen=True)
class Lazy:
    """`module:name`, imported when first read; a call passes `args` first, then its own arguments."""

    path: str
    args: tuple[Any, ...] = ()

    def get(self) -> Any:
        module, name = self.path.split(":")
        return getattr(importlib.import_module(module), name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.get()(*self.args, *args, **kwargs)


def on_disk(relative: str) -> Lazy:
    """The checksum of the files at `relative` (a file or a folder) under data.root."""
    return Lazy("glmc.data.fingerprint:files_checksum", (relative,))


def embedded(*sources: Lazy) -> Lazy:
    """The checksum of data that ships with Python or a library: `sources` give its text or bytes."""
    return Lazy("glmc.data.fingerprint:embedded_checksum", (sources,))


def at_path() -> Lazy:
    """The checksum of the user's own file, data.path."""
    return Lazy("glmc.data.fingerprint:path_checksum")


@dataclass(frozen=True)
class DatasetInfo:
    """One dataset: the data.task values it serves, its images' shape, its text classes (`labels`), the most
    data.num_subsets it cuts, the conf/data option per task where not its name (`examples`), whether it reads
    data.path, and `checks`: what would keep its data from loading, asked of the run config before any work."""

    name: str
    modality: str
    tasks: tuple[str, ...]
    loader: Callable[[Any], tuple]  # of the run's DataConfig
    fingerprint: Callable[[Any], str | None]
    image_size: int | None = None
    channels: int | None = None
    classes: int | None = None
    resizable: bool = False
    labels: Lazy | None = None
    wordpiece: bool = False
    subsets: Lazy | None = None
    examples: dict[str, str] = field(default_factory=dict)
    reads_path: bool = False
    checks: Lazy | None = None

    @property
    def is_text(self) -> bool:
        return self.modality == TEXT

    @property
    def maskable(self) -> bool:
        return MASKED_LM in self.tasks

    def num_classes(self) -> int | None:
        return self.classes if self.labels is None else len(self.labels.get())

    def example(self, task: str) -> str:
        """The conf/data option (data=<it>) that runs this dataset with `task`."""
        return self.examples.get(task, self.name)


DIGITS = Lazy("glmc.data.digits:digits_content")
PYDOC = Lazy("glmc.data.pydoc_corpus:pydoc_text")
TOPICS = "glmc.data.pydoc_topics"


def _cifar(name: str, folder: str, classes: int) -> DatasetInfo:
    """CIFAR-10 or CIFAR-100: 32x32 colour images in the python batches of `folder` under data.root."""
    loader, files = Lazy("glmc.data.cifar:cifar_splits"), on_disk(folder)
    return DatasetInfo(name, IMAGES, (CLASSIFICATION,), loader, files, image_size=32, channels=3, classes=classes)


DATASETS: dict[str, DatasetInfo] = {
    info.name: info
    for info in (
        DatasetInfo(
            "digits",  # sklearn's 8x8 digits, embedded; the default
            IMAGES,
            (CLASSIFICATION,),
            Lazy("glmc.data.digits:digits_splits"),
            embedded(DIGITS),
            image_size=8,
            channels=1,
            classes=10,
            resizable=True,
        ),
        _cifar("cifar10", "cifar-10-batches-py", classes=10),
        _cifar("cifar100", "cifar-100-python", classes=100),
        DatasetInfo(
            "tiny_imagenet",
            IMAGES,
            (CLASSIFICATION,),
            Lazy("glmc.data.tiny_imagenet:tiny_imagenet_splits"),
            on_disk("tiny-imagenet-200"),
            image_size=64,
            channels=3,
            classes=200,
        ),
        DatasetInfo(
            "pydoc",  # CPython's help topics, embedded
            TEXT,
            (CAUSAL_LM, MASKED_LM),
            Lazy("glmc.data.pydoc_corpus:pydoc_splits"),
            embedded(PYDOC),
            examples={MASKED_LM: "pydoc_mlm"},
        ),
        DatasetInfo(
            "pydoc_topics",  # the help topics as a 4-way sequence-classification task
            TEXT,
            (CLASSIFICATION,),
            Lazy(f"{TOPICS}:pydoc_topics_splits"),
            embedded(PYDOC, Lazy(f"{TOPICS}:task_definition")),  # its labels and cutting rules are data too
            labels=Lazy(f"{TOPICS}:LABELS"),
            wordpiece=True,
            subsets=Lazy(f"{TOPICS}:max_subsets"),
        ),
        DatasetInfo(
            "tiny_shakespeare",
            TEXT,
            (CAUSAL_LM, MASKED_LM),
            Lazy("glmc.data.tiny_shakespeare:tiny_shakespeare_splits"),
            on_disk("tiny_shakespeare/input.txt"),
        ),
        DatasetInfo(
            "bookcorpus",  # examples padded with GPT-2's EOS: no fixed windows to mask
            TEXT,
            (CAUSAL_LM,),
            Lazy("glmc.data.bookcorpus:bookcorpus_splits"),
            on_disk("bookcorpus"),
        ),
        DatasetInfo(
            "text_file",  # your own UTF-8 text file, data.path, read with the models' saved tokenizer
            TEXT,
            (CAUSAL_LM, MASKED_LM),
            Lazy("glmc.data.text_file:text_file_splits"),
            at_path(),
            reads_path=True,
            checks=Lazy("glmc.data.text_file:text_file_problems"),
        ),
    )
}


def dataset_names() -> list[str]:
    return list(DATASETS)


def dataset(name: Any) -> DatasetInfo:
    """The entry of data.name=`name`; ValueError naming the known datasets."""
    info = DATASETS.get(str(name))
    if info is None:
        raise ValueError(f"data.name={name!r} is not a known dataset ({', '.join(DATASETS)})")
    return info


def datasets_for(task: str | None = None, modality: str | None = None) -> list[DatasetInfo]:
    """The datasets that serve `task` (any when None) and are of `modality` (any when None)."""
    fits = lambda d: (task is None or task in d.tasks) and (modality is None or d.modality == modality)
    return [d for d in DATASETS.values() if fits(d)]


def example_option(task: str, modality: str) -> str | None:
    """The first conf/data option that runs `task` on data of `modality` (for a message), or None."""
    found = datasets_for(task, modality)
    return found[0].example(task) if found else None
