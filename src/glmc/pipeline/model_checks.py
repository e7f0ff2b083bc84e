"""What a run's model settings must satisfy, asked of the model's family: keys, heads, tasks, fit to the data."""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING, Any

from glmc.config import Config, ModelConfig
from glmc.datasets import IMAGES, TEXT, DatasetInfo, dataset
from glmc.models.families import families_for_data, family_named
from glmc.ranges import finite_number, setting_problems

if TYPE_CHECKING:
    from glmc.models.families.base import Family


def model_problems(cfg: Config) -> list[str]:
    """The shared model of trained endpoints: its keys, its heads and its fit to the data."""
    model = cfg.model
    problems = []
    if model.num_heads >= 1 and model.hidden_size % model.num_heads:
        problems.append(
            f"model.hidden_size={model.hidden_size}: not divisible by model.num_heads={model.num_heads}; "
            "choose a width that is a multiple of the number of heads"
        )
    family, info = family_named(str(model.family)), dataset(cfg.data.name)
    # an image model reads the size a resizable dataset loads at (its cache key holds model.image_size); a
    # size below the native one is refused by glmc.data.checks
    size = cfg.data.image_size
    loaded = info.image_size if size is None else size
    if info.resizable and family.data_kind == IMAGES and loaded >= info.image_size and model.image_size != loaded:
        problems.append(
            f"data.image_size={size}: data={info.name} would load at {loaded}x{loaded} but model.image_size="
            f"{model.image_size}; set data.image_size={model.image_size} (or choose a model for "
            f"{loaded}x{loaded} images)"
        )
    problems += _head_problems(cfg, family, info)
    return problems + model_key_problems(model, "model") + fits_data(cfg, model, "model")


def _head_problems(cfg: Config, family: Family, info: DatasetInfo) -> list[str]:
    """The family's tasks and heads against data.task, and a pretrained start's head and token ids."""
    heads = family.task_heads
    problems = []
    if cfg.data.task not in family.tasks:
        # the families for the data's kind: the model's own kind may be the wrong one (a ViT on text)
        kind = info.modality
        others = [n for n in families_for_data(kind) if cfg.data.task in family_named(n).tasks]
        fix = (
            f"choose a model of family {' or '.join(others)}"
            if others
            else f"no model family trains on {cfg.data.task} with {kind}; choose another data.task or data"
        )
        trains = ", ".join(family.tasks)
        problems.append(f"data.task={cfg.data.task}: model.family={family.name} trains on {trains}; {fix}")
    elif heads and cfg.model.head not in heads:
        problems.append(f"model.head={cfg.model.head}: model.family={family.name} has heads {', '.join(heads)}")
    elif heads and heads[cfg.model.head] != cfg.data.task:
        fits = [h for h, task in heads.items() if task == cfg.data.task]
        fix = f"use model.head={fits[0]}" if fits else f"no {family.name} head trains on it"
        problems.append(
            f"model.head={cfg.model.head} trains on {heads[cfg.model.head]}, data.task={cfg.data.task}: {fix}"
        )
    pre = cfg.pretrain
    if not pre.enabled:
        return problems
    if pre.head not in heads:
        named = f"heads {', '.join(heads)}" if heads else "one head only"
        problems.append(
            f"pretrain.head={pre.head}: model.family={family.name} has {named}, so it cannot be pretrained with another"
        )
    elif heads[pre.head] != pre.data.task:
        problems.append(f"pretrain.head={pre.head} trains on {heads[pre.head]}, pretrain.data.task={pre.data.task}")
    same = ("tokenizer", "tokenizer_vocab", "tokenizer_path", "val_fraction", "test_fraction")
    wordpiece = "wordpiece" in (pre.data.tokenizer, cfg.data.tokenizer)  # its ids are learned from these
    return problems + [
        f"pretrain.data.{key}={pre.data[key]} but data.{key}={cfg.data[key]}: the pretrained model's "
        "token ids would not be the fine-tuning data's; set both alike"
        for key in same
        if wordpiece and pre.data[key] != cfg.data[key]
    ]


def model_key_problems(model: Any, prefix: str, keys: set[str] | None = None) -> list[str]:
    """Keys set that the family does not read, and the ranges of those it reads (`keys`: only these)."""
    family = family_named(str(model.family))
    reads, defaults = family.reads_model_keys(), ModelConfig()
    checked = [f.name for f in fields(ModelConfig) if keys is None or f.name in keys]
    problems = []
    for key in (k for k in checked if k not in reads and model[k] != getattr(defaults, k)):
        problems.append(
            f"{prefix}.{key}={model[key]}: model.family={family.name} does not read it (beyond the block sizes it "
            f"reads {', '.join(family.model_keys) or 'nothing'}); remove the setting (default {getattr(defaults, key)})"
        )
    read = {k: model[k] for k in checked if k in reads}
    problems += setting_problems(ModelConfig, read, prefix)
    for key, value in family.fixed_model_values.items():
        if key in checked and model[key] != value:
            problems.append(
                f"{prefix}.{key}={model[key]}: model.family={family.name} fixes it at {value} (its Hugging Face "
                f"config has no setting for it); set {prefix}.{key}={value}"
            )
    if "hidden_act" in read:
        from glmc.models.canonical import canonical_activation

        try:
            canonical_activation(str(read["hidden_act"]))
        except ValueError as err:  # it lists the known names
            problems.append(f"{prefix}.hidden_act={read['hidden_act']}: {err}; set one of them")
    return problems + family.model_problems(model, prefix, set(checked))  # the family's own


def fits_data(cfg: Config, model: Any, key: str) -> list[str]:
    """A text dataset needs a language model whose positions hold a window; images an image model."""
    kind = dataset(cfg.data.name).modality
    family, text = str(model.family), kind == TEXT
    if family_named(family).data_kind != kind:
        choices = " or ".join(f"model.family={name}" for name in families_for_data(kind))
        return [f"{key}.family={family}: data={cfg.data.name} is {kind}; choose a model for {kind} ({choices})"]
    seq_len = cfg.data.seq_len
    if text and finite_number(seq_len) and seq_len > model.max_positions:
        return [
            f"data.seq_len={seq_len}: longer than the {model.max_positions} positions of the model "
            f"({key}.max_positions={model.max_positions}); set data.seq_len<={model.max_positions} or "
            f"model.max_positions>={seq_len}"
        ]
    return []
