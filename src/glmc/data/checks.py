"""What a run's data settings must satisfy, asked of the dataset's registry entry (glmc.datasets)."""

from __future__ import annotations

from typing import Any

from glmc.config import DataConfig
from glmc.datasets import MASKED_LM, TEXT, DatasetInfo, dataset, datasets_for, example_option
from glmc.ranges import finite_number, setting_problems


def data_problems(cfg: Any, pretrained: bool = False) -> list[str]:
    """Every data.* setting that cannot work with data.name's dataset."""
    data = cfg.data
    problems = setting_problems(DataConfig, data, "data")  # the ranges DataConfig declares
    problems += [
        f"data.{key}={data[key]}: keep at least 1 example, or null for the whole split"
        for key in ("limit_train", "limit_test")
        if data[key] is not None and data[key] < 1
    ]
    problems += [
        f"data.{k}={data[k]}: use a batch size of at least 1" for k in ("batch_size", "eval_batch_size") if data[k] < 1
    ]
    info = dataset(data.name)  # the entry, read once: every check below asks it
    problems += _fraction_problems(data, info) + _task_problems(cfg, info, pretrained)
    if data.path is not None and not info.reads_path:
        readers = [d.name for d in datasets_for() if d.reads_path]
        problems.append(
            f"data.path={data.path}: data={info.name} does not read it (data.path is the text file of "
            f"data={' or data='.join(readers)}); use data={readers[0]} to evaluate on that file, or remove the setting"
        )
    elif info.checks is not None:  # the entry's own (a file it needs)
        problems += list(info.checks(cfg))
    return problems + _image_size_problems(data, info)


def _task_problems(cfg: Any, info: DatasetInfo, pretrained: bool) -> list[str]:
    """The task and tokenizer against the data (masked LM needs [CLS] and [MASK]), its labels and subsets."""
    data = cfg.data
    problems = []
    # the user's own file says which tokenizer it needs in its own check (the entry's `checks`, asked by data_problems)
    if data.tokenizer == "pretrained" and not data.tokenizer_path and not info.reads_path:
        problems.append(
            "data.tokenizer=pretrained: reads the tokenizer saved in data.tokenizer_path; set data.tokenizer_path="
            "<folder written by save_pretrained> (endpoints=pretrained reads its first folder's)"
        )
    if data.task not in info.tasks:
        maskable = " or ".join(d.name for d in datasets_for(MASKED_LM, TEXT))
        problems.append(
            f"data.task=masked_lm: data={info.name} has no masked-LM windows; use data="
            f"{example_option(MASKED_LM, TEXT)} (or data.name={maskable})"
            if data.task == MASKED_LM
            else f"data.task={data.task}: data={info.name} is a {' or '.join(info.tasks)} task"
        )
    if data.task == MASKED_LM:
        if data.tokenizer not in ("wordpiece", "pretrained"):
            problems.append(
                f"data.tokenizer={data.tokenizer}: data.task=masked_lm needs [CLS] and [MASK] tokens; use "
                "data.tokenizer=wordpiece"
            )
        if not (finite_number(data.mask_prob) and 0 < data.mask_prob < 1):
            problems.append(f"data.mask_prob={data.mask_prob}: use a share in (0, 1) (BERT: 0.15)")
        if finite_number(data.seq_len) and data.seq_len < 2:
            problems.append(f"data.seq_len={data.seq_len}: a masked-LM window needs [CLS] and at least one token")
    if info.wordpiece and data.tokenizer not in ("wordpiece", "pretrained"):
        problems.append(
            f"data.tokenizer={data.tokenizer}: data={data.name} reads WordPiece ids; use data.tokenizer=wordpiece"
        )
    if info.labels is not None and not pretrained and cfg.model.num_labels != info.num_classes():
        labels = info.labels.get()
        problems.append(
            f"model.num_labels={cfg.model.num_labels}: data={data.name} has {len(labels)} labels "
            f"({', '.join(labels)}); set model.num_labels={len(labels)}"
        )
    return problems + _subset_problems(data, info)


def _subset_problems(data: Any, info: DatasetInfo) -> list[str]:
    """data.num_subsets and data.subset, checked in every run (the topics are counted only where read)."""
    most = None if info.subsets is None else info.subsets()
    if not (finite_number(data.num_subsets) and 1 <= data.num_subsets <= (most or data.num_subsets)):
        upto = f"1 to {most} (every dataset must hold topics of every label)" if most else "at least 1"
        return [f"data.num_subsets={data.num_subsets}: use {upto}"]
    if not (finite_number(data.subset) and 0 <= data.subset < data.num_subsets):
        return [
            f"data.subset={data.subset}: pick one of the data.num_subsets={data.num_subsets} datasets "
            f"(0 to {data.num_subsets - 1})"
        ]
    return []


def _fraction_problems(data: Any, info: DatasetInfo) -> list[str]:
    """The held-out shares: images may hold out no validation split, text cuts train, validation and test."""
    val, test = data.val_fraction, data.test_fraction
    problems = []
    if info.is_text and not (finite_number(val) and 0 < val < 1):
        problems.append(
            f"data.val_fraction={val}: data={data.name} cuts a validation block from its text; use a value "
            "in (0, 1) (e.g. data.val_fraction=0.05)"
        )
    elif not (finite_number(val) and 0 <= val < 1):
        problems.append(f"data.val_fraction={val}: use a value in [0, 1) (0: no validation split)")
    if not (finite_number(test) and 0 < test < 1):
        problems.append(f"data.test_fraction={test}: use a value in (0, 1) (e.g. data.test_fraction=0.2)")
    elif finite_number(val) and 0 <= val < 1 and val + test >= 1:
        problems.append(
            f"data.val_fraction={val} and data.test_fraction={test}: together they leave no training data; "
            "keep their sum below 1"
        )
    return problems


def _image_size_problems(data: Any, info: DatasetInfo) -> list[str]:
    """data.image_size resizes the datasets the registry marks resizable only, never below their native size."""
    size = data.image_size
    if size is not None and not info.resizable:
        resizable = " or ".join(f"data={d.name}" for d in datasets_for() if d.resizable)
        return [
            f"data.image_size={size}: only {resizable} is resized (data={data.name} loads its images at "
            "their own size); remove the setting"
        ]
    native = info.image_size
    if size is not None and size < native:
        return [
            f"data.image_size={size}: data={info.name}'s images are {native}x{native}; use {native} or more "
            "(e.g. data.image_size=32), or null"
        ]
    return []
