"""Checks that run before any data is loaded or any model trained.

`validate_config` refuses settings that would crash or mislead hours later (duplicate seeds, a
barrier without an interior point, empty data slices, learning rates that are not positive and
finite, out-of-range settings of every method and of multi-model runs, endpoints of different
widths that cannot be embedded into the first, keys the schema does not know, a `_target_` naming
anything but the classes glmc builds (glmc.pipeline.targets), a cache_dir that loops, is a file or
cannot be written; with endpoints=pretrained, model folders that loop, cannot be read or do not fit the
data or each other, through glmc.pipeline.folder_fit). What a dataset allows comes from its entry in
glmc.data.registry. The run folder is checked by glmc.pipeline.run_folder.
"""

from __future__ import annotations

import errno
import inspect
import logging
import os
import tempfile
import typing
from collections import Counter
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from glmc.config import Config, ModelConfig, MultiConfig, TrainerConfig
from glmc.data.registry import IMAGES, MASKED_LM, TEXT, dataset, datasets_for, example_option
from glmc.models.families import families_for_data, family_named
from glmc.pipeline.pairing import seed_pairs  # the pipeline's own pairing: its errors name the seeds
from glmc.pipeline.targets import target_problems, trainer_target_allowed
from glmc.settings.methods import METHODS, MULTI_METHODS
from glmc.settings.ranges import RULES, SEED_LIMIT, finite_number, setting_problems
from glmc.symmetry.family_defaults import AUTO

log = logging.getLogger(__name__)

# endpoints of different widths (endpoint_models) share these with the first, and the keys their
# family names (and the family, which every endpoint's data fixes): only the widths differ. A canonical
# path takes its norm eps from the first model, so eps is shared too
SHARED_MODEL_KEYS = ("num_layers", "hidden_act", "layer_norm_eps")
# what is embedded into the first endpoint's shapes may not be larger there
WIDTHS = ("hidden_size", "num_heads", "mlp_size", "head_size")


class ConfigError(ValueError):
    """A setting that cannot work; the message names the key, its value and what to do."""


# the config's other sections, by key: a rule of glmc.settings.ranges.RULES each. The methods' settings
# (matcher.<name>.*, multi.*) declare their ranges where they are declared (glmc.settings, MultiConfig)
SECTION_RULES = {
    "model": {
        **dict.fromkeys(("hidden_size", "num_layers", "num_heads", "mlp_size"), "count"),
        **dict.fromkeys(("image_size", "patch_size", "num_channels", "num_labels"), "count"),
        **dict.fromkeys(("vocab_size", "max_positions"), "count"),
        "dropout": "fraction",
        "layer_norm_eps": "positive",
        "type_vocab_size": "count",
        "rope_theta": "positive",
        "rotary_pct": "share",
    },
    "data": {
        "seq_len": "count",
        "split_seed": "seed",
        "num_workers": "count0",
        "tokenizer_vocab": "count",
        "mask_seed": "seed",
    },
    "train": {
        "weight_decay": "nonnegative",
        "warmup_fraction": "fraction",
        "label_smoothing": "fraction",
        "gradient_clip_val": "nonnegative",
        "accumulate_grad_batches": "count",
        "parallel_endpoints": "count",
    },
    "merge": {"batches": "count", "regmean_alpha": "share"},  # RegMean's alpha G + (1 - alpha) diag(G)
}


def _range_problems(key: str, value: Any, rule: str) -> list[str]:
    found = RULES[rule]
    return [] if found.holds(value) else [f"{key}={value}: {found.fix.format(key=key)}"]


def _section_problems(prefix: str, node: Any, rules: dict[str, str]) -> list[str]:
    return [
        p for name, rule in rules.items() if name in node for p in _range_problems(f"{prefix}.{name}", node[name], rule)
    ]


def _lr_problems(key: str, value: Any, example: str) -> list[str]:
    if RULES["positive"].holds(value):
        return []
    return [f"{key}={value}: the learning rate must be positive and finite (e.g. {key}={example})"]


def _problems(cfg: Config) -> tuple[list[str], Any]:
    """(what cannot work, the endpoints' model family or None where the folders cannot be read)."""
    pretrained = str(cfg.endpoints.source) == "pretrained"
    if pretrained:  # the folders bring the models: model.*, seeds and training are not read
        from glmc.pipeline.folder_fit import folder_problems
        from glmc.pipeline.hf_folders import evaluation_config

        loops = _path_problems(cfg)  # a folder that loops would stop the folders' reader itself
        folders, problems = ([], loops) if loops else folder_problems(cfg)
        family = folders[0].family if folders else None
        where = f"the {family.name} family (endpoints.paths)" if family else ""
        problems += _pretrained_setting_problems(cfg)
        cfg = evaluation_config(cfg)  # the data as the run reads them: text with the folders' tokenizer
    else:
        family = family_named(str(cfg.model.family))
        where = f"model.family={family.name}"
        problems = _seed_problems(cfg) + _pairing_problems(cfg) + _path_problems(cfg)
        if cfg.endpoints.paths:
            problems.append(
                f"endpoints.paths={list(cfg.endpoints.paths)}: model folders are read with endpoints=pretrained only; "
                "add endpoints=pretrained, or leave endpoints.paths empty to train the endpoints from seeds"
            )
    if cfg.threads is not None and cfg.threads < 1:
        problems.append(f"threads={cfg.threads}: use at least 1, or null for torch's default")
    if cfg.eval.num_lambdas < 3:
        problems.append(
            f"eval.num_lambdas={cfg.eval.num_lambdas}: a barrier needs a point between the endpoints; "
            "use at least 3 (11 is the default)"
        )
    if cfg.eval.cache_batches_mb < 0:
        problems.append(f"eval.cache_batches_mb={cfg.eval.cache_batches_mb}: use 0 (no cache) or a positive size")
    problems += _lr_problems("train.lr", cfg.train.lr, "3e-3")
    if cfg.train.max_epochs < 1:
        problems.append(f"train.max_epochs={cfg.train.max_epochs}: train for at least 1 epoch")
    patience = cfg.train.early_stopping_patience
    if patience is not None and patience < 0:
        problems.append(f"train.early_stopping_patience={patience}: use 0 or more, or null for no early stopping")
    for section, rules in SECTION_RULES.items():
        if section != "model":  # model: by its family (_model_key_problems)
            problems += _section_problems(section, cfg[section], rules)
    if not pretrained and cfg.model.num_heads >= 1 and cfg.model.hidden_size % cfg.model.num_heads:
        problems.append(
            f"model.hidden_size={cfg.model.hidden_size}: not divisible by model.num_heads={cfg.model.num_heads}; "
            "choose a width that is a multiple of the number of heads"
        )
    for key in ("limit_train", "limit_test"):
        value = cfg.data[key]
        if value is not None and value < 1:
            problems.append(f"data.{key}={value}: keep at least 1 example, or null for the whole split")
    for key in ("batch_size", "eval_batch_size"):
        if cfg.data[key] < 1:
            problems.append(f"data.{key}={cfg.data[key]}: use a batch size of at least 1")
    problems += _fraction_problems(cfg)
    problems += _task_problems(cfg, pretrained)
    problems += _dataset_problems(cfg)
    problems += _image_size_problems(cfg, pretrained)
    if not pretrained:  # the folders' models are checked against the data by folder_problems
        problems += _head_problems(cfg)
        problems += _model_problems(cfg)
    problems += _method_problems(cfg, family, where)
    problems += _multi_problems(cfg)
    problems += _precision_problems(cfg)
    problems += _parallel_problems(cfg)
    problems += _unknown_keys(cfg, Config, "")
    return problems, family


def symlink_loop(path: str | Path) -> bool:
    """Whether `path`, or a folder on the way to it, is a symbolic link that leads back to itself."""
    try:
        os.stat(Path(path).expanduser())
    except OSError as err:
        return err.errno == errno.ELOOP
    return False


LOOP = "a symbolic link on this path leads back to itself (a loop), so nothing can be read or written there"


def _path_problems(cfg: Config) -> list[str]:
    """The folders a run reads or writes besides its run folder (glmc.pipeline.run_folder): with
    endpoints=pretrained the folders of endpoints.paths must not loop; with trained endpoints cache_dir
    must not loop, must be a folder (or one that can be created) and must be writable, since the cache
    takes a lock file even to load an endpoint."""
    if str(cfg.endpoints.source) == "pretrained":
        return [
            f"endpoints.paths[{i}]={path}: {LOOP}; remove the link or give the model folder itself"
            for i, path in enumerate(cfg.endpoints.paths)
            if symlink_loop(str(path))
        ]
    key, path = f"cache_dir={cfg.cache_dir}", Path(str(cfg.cache_dir)).expanduser()
    if symlink_loop(path):
        return [f"{key}: {LOOP}; remove the link or set cache_dir=<another folder>"]
    existing = path
    while not existing.exists() and existing != existing.parent:  # the cache is created below this one
        existing = existing.parent
    if not existing.is_dir():
        what = "is a file" if existing == path else f"cannot be created: {existing} is a file"
        return [f"{key}: {what}, not a folder; set cache_dir=<a folder> to cache the trained endpoints in"]
    try:
        with tempfile.TemporaryFile(dir=existing, prefix=".glmc-write-probe-"):
            pass
    except OSError as err:
        what = "is not writable" if existing == path else f"cannot be created in {existing}"
        return [
            f"{key}: {what} ({err.strerror or err}); the trained endpoints are cached there: make it writable "
            "or set cache_dir=<a writable folder>"
        ]
    return []


def _parallel_problems(cfg: Config) -> list[str]:
    """train.parallel_endpoints > 1 trains each endpoint in a process of its own on one device: not with
    Trainers that spread one endpoint over several devices or processes (DDP)."""
    trainer, parallel = cfg.trainer, cfg.train.parallel_endpoints
    if parallel in (None, 1) or not RULES["count"].holds(parallel):
        return []
    if str(trainer.devices) == "1" and trainer.num_nodes == 1 and "ddp" not in str(trainer.strategy):
        return []
    return [
        f"train.parallel_endpoints={parallel}: each endpoint trains in a process of its own on one device, "
        f"not with trainer.devices={trainer.devices}, trainer.strategy={trainer.strategy}, "
        f"trainer.num_nodes={trainer.num_nodes}; use train.parallel_endpoints=1 with these, or trainer=gpu "
        "or trainer=cpu"
    ]


def _precision_problems(cfg: Config) -> list[str]:
    """trainer.precision that glmc does not train with, or 16-mixed on CPU (glmc.train.trainer)."""
    from glmc.train.trainer import resolve_precision

    try:
        resolve_precision(cfg.trainer.precision, cfg.trainer.accelerator)
    except ValueError as err:
        return [str(err)]
    return []


def _pretrained_setting_problems(cfg: Config) -> list[str]:
    """Settings of trained endpoints that an endpoints=pretrained run cannot honour."""
    problems = []
    if cfg.endpoint_models:
        problems.append(
            "endpoint_models: read with endpoints=trained only; the folders of endpoints.paths bring their own "
            "models (leave endpoint_models empty)"
        )
    if cfg.pretrain.enabled:
        problems.append(
            "pretrain.enabled=true: fine-tunes trained endpoints from a pretrained model; endpoints=pretrained "
            "trains nothing (set pretrain.enabled=false)"
        )
    return problems


def _seed_problems(cfg: Config) -> list[str]:
    problems = []
    seeds = list(cfg.seeds)
    repeated = sorted(s for s, n in Counter(seeds).items() if n > 1)
    if repeated:
        problems.append(
            f"seeds={seeds}: seed {repeated[0]} appears more than once; a pair of one seed is one model twice, "
            "so give every endpoint its own seed (e.g. seeds=[0,1])"
        )
    negative = [s for s in seeds if s < 0]
    if negative:
        problems.append(f"seeds={seeds}: seed {negative[0]} is negative; use seeds >= 0")
    large = [s for s in seeds if s >= SEED_LIMIT]
    if large:
        problems.append(f"seeds={seeds}: seed {large[0]} is too large; use seeds in [0, 2^32)")
    return problems


def _pairing_problems(cfg: Config) -> list[str]:
    try:
        seed_pairs(list(cfg.seeds), str(cfg.pairing))
    except ValueError as err:
        return [str(err)]
    if cfg.pairing == "universe" and len(cfg.seeds) < 3:
        return [f"seeds={list(cfg.seeds)}: pairing=universe aligns three or more models; give at least 3 seeds"]
    return []


def _head_problems(cfg: Config) -> list[str]:
    """Families with a head per task (BERT): model.head must be the data's task, and a pretrained start
    (pretrain.enabled) needs a head of the family trained on pretrain.data's task, with the same ids."""
    family = family_named(str(cfg.model.family))
    heads = family.task_heads
    problems = []
    if cfg.data.task not in family.tasks:
        # the families for the data's kind: the model's own kind may be the wrong one (a ViT on text)
        kind = dataset(cfg.data.name).modality
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
    if pre.data.tokenizer == "wordpiece" or cfg.data.tokenizer == "wordpiece":
        for key in same:  # WordPiece ids are learned from the corpus' training block: all of these fix them
            if pre.data[key] != cfg.data[key]:
                problems.append(
                    f"pretrain.data.{key}={pre.data[key]} but data.{key}={cfg.data[key]}: the pretrained model's "
                    "token ids would not be the fine-tuning data's; set both alike"
                )
    return problems


def _task_problems(cfg: Config, pretrained: bool = False) -> list[str]:
    """The task against the data: masked LM needs WordPiece's [CLS] and [MASK] (or a saved tokenizer's,
    data.tokenizer=pretrained) and fixed windows, the topic task is classification over WordPiece ids
    and picks one of its datasets."""
    data = cfg.data
    problems = []
    info = dataset(data.name)
    # the user's own file says which tokenizer it needs in its own check (_dataset_problems)
    if data.tokenizer == "pretrained" and not data.tokenizer_path and not info.reads_path:
        problems.append(
            "data.tokenizer=pretrained: reads the tokenizer saved in data.tokenizer_path; set data.tokenizer_path="
            "<folder written by save_pretrained> (endpoints=pretrained reads its first folder's)"
        )
    if data.task not in info.tasks:
        problems.append(_task_refusal(data.task, info))
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
    return problems + _subset_problems(data)


def _dataset_problems(cfg: Config) -> list[str]:
    """data.path where the dataset reads no file of the user's, and the dataset's own checks (its registry
    entry's `checks`: a file it needs, the tokenizer to read it with)."""
    info = dataset(cfg.data.name)
    if cfg.data.path is not None and not info.reads_path:
        readers = [d.name for d in datasets_for() if d.reads_path]
        return [
            f"data.path={cfg.data.path}: data={info.name} does not read it (data.path is the text file of "
            f"data={' or data='.join(readers)}); use data={readers[0]} to evaluate on that file, or remove the setting"
        ]
    return [] if info.checks is None else list(info.checks(cfg))


def _task_refusal(task: str, info) -> str:
    """data.task=`task` on a dataset that does not serve it: what serves it instead."""
    if task == MASKED_LM:
        maskable = [d.name for d in datasets_for(MASKED_LM, TEXT)]
        return (
            f"data.task=masked_lm: data={info.name} has no masked-LM windows; use data="
            f"{example_option(MASKED_LM, TEXT)} (or data.name={' or '.join(maskable)})"
        )
    return f"data.task={task}: data={info.name} is a {' or '.join(info.tasks)} task"


def _subset_problems(data: Any) -> list[str]:
    """data.num_subsets and data.subset: read by data=pydoc_topics only, checked in every run (the
    topics are counted only where they are read)."""
    subsets = dataset(data.name).subsets
    most = None if subsets is None else subsets()
    if not (finite_number(data.num_subsets) and 1 <= data.num_subsets <= (most or data.num_subsets)):
        upto = f"1 to {most} (every dataset must hold topics of every label)" if most else "at least 1"
        return [f"data.num_subsets={data.num_subsets}: use {upto}"]
    if not (finite_number(data.subset) and 0 <= data.subset < data.num_subsets):
        return [
            f"data.subset={data.subset}: pick one of the data.num_subsets={data.num_subsets} datasets "
            f"(0 to {data.num_subsets - 1})"
        ]
    return []


def _fraction_problems(cfg: Config) -> list[str]:
    """The held-out shares: an image dataset holds out no validation images with val_fraction 0, while the
    text datasets cut their corpus into train, validation and test blocks and need all three."""
    val, test = cfg.data.val_fraction, cfg.data.test_fraction
    problems = []
    if dataset(cfg.data.name).is_text and not (finite_number(val) and 0 < val < 1):
        problems.append(
            f"data.val_fraction={val}: data={cfg.data.name} cuts a validation block from its text; use a value "
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


def _model_problems(cfg: Config) -> list[str]:
    """The shared model against the data, and the per-endpoint models (endpoint_models) against the
    first one, which every narrower endpoint is embedded into."""
    problems = _model_key_problems(cfg.model, "model") + _fits_data(cfg, cfg.model, "model")
    entries = list(cfg.endpoint_models or [])
    if not entries:
        return problems
    if len(entries) != len(cfg.seeds):
        return problems + [
            f"endpoint_models has {len(entries)} entries for {len(cfg.seeds)} seeds: give one per seed "
            "({} keeps the shared model)"
        ]
    if cfg.pairing == "universe":
        problems.append(
            "endpoint_models: pairing=universe needs endpoints of one shape; leave endpoint_models empty "
            "(endpoint_models=[])"
        )
    elif "vanilla" in cfg.matcher.methods:
        problems.append(
            f"matcher.methods={list(cfg.matcher.methods)}: vanilla interpolates the original models, which "
            "differ in shape (endpoint_models): drop vanilla from matcher.methods"
        )
    from glmc.pipeline.endpoints import endpoint_config

    models = []
    for index in range(len(entries)):
        try:
            models.append(endpoint_config(cfg, index).model)
        except ValueError as err:
            first_line = (str(err).splitlines() or [""])[0]
            problems.append(f"{first_line}; endpoint_models[{index}] takes the keys of model")
    if len(models) < len(entries):
        return problems
    where = [f"endpoint_models[{i}] (seed {s})" for i, s in enumerate(cfg.seeds)]
    shared = cfg.model
    for index, model in enumerate(models):  # what the shared model's checks have not covered
        problems += _model_key_problems(model, f"{where[index]}: model", set(entries[index]))
        if (model.family, model.max_positions) != (shared.family, shared.max_positions):
            problems += _fits_data(cfg, model, f"{where[index]}: model")
        own = (model.hidden_size, model.num_heads) != (shared.hidden_size, shared.num_heads)
        if own and model.num_heads >= 1 and model.hidden_size % model.num_heads:
            problems.append(
                f"{where[index]}: model.hidden_size={model.hidden_size} is not divisible by "
                f"model.num_heads={model.num_heads}"
            )
    first = models[0]
    for index, model in enumerate(models[1:], 1):
        for key in (*SHARED_MODEL_KEYS, *family_named(str(first.family)).shared_model_keys):
            if model[key] != first[key]:
                problems.append(
                    f"{where[index]}: model.{key}={model[key]} differs from endpoint 0's {first[key]}; endpoints of "
                    f"different widths differ in their widths only (set {key}: {first[key]} in endpoint_models"
                    f"[{index}] or leave it out there)"
                )
    try:
        pairs = seed_pairs(list(cfg.seeds), str(cfg.pairing))
    except ValueError:  # _pairing_problems names it
        return problems
    for a, b in pairs:
        wide, narrow = _widths(models[a]), _widths(models[b])
        larger = [k for k in WIDTHS if narrow[k] > wide[k]]
        if larger:
            key = larger[0]
            problems.append(
                f"{where[b]}: {key} {narrow[key]} is larger than the {wide[key]} of {where[a]}, which it is embedded "
                f"into (pairing={cfg.pairing} aligns seed {cfg.seeds[b]} to seed {cfg.seeds[a]}); put the widest "
                "model first (pairing=first aligns every endpoint to the first)"
            )
            continue
        from glmc.symmetry.embed_width import planned_width_problems

        for problem in planned_width_problems(str(models[a].family), models[a], models[b]):
            problems.append(
                f"{where[b]} ({models[b].family}) cannot be embedded exactly into {where[a]}, which it is aligned to: "
                f"{problem}; choose endpoint_models whose heads the first model's hold"
            )
    return problems


def _model_key_problems(model: Any, prefix: str, keys: set[str] | None = None) -> list[str]:
    """Keys of `model` that its family does not read, set away from their defaults (the model would
    ignore them and the endpoint cache key would not tell the runs apart), and the ranges of the keys
    it reads. `keys`: check only these (an endpoint_models entry's own; the rest are the shared model's)."""
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
    problems += _section_problems(prefix, read, SECTION_RULES["model"])
    for key, value in family.fixed_model_values.items():
        if key in checked and model[key] != value:
            problems.append(
                f"{prefix}.{key}={model[key]}: model.family={family.name} fixes it at {value} (its Hugging Face "
                f"config has no setting for it); set {prefix}.{key}={value}"
            )
    kv, heads = model.num_kv_heads, model.num_heads
    if "num_kv_heads" in reads and kv is not None and {"num_kv_heads", "num_heads"} & set(checked):
        if not (finite_number(kv) and kv >= 1 and finite_number(heads) and heads % kv == 0):
            problems.append(
                f"{prefix}.num_kv_heads={kv}: key/value heads must be at least 1 and divide {prefix}.num_heads="
                f"{heads}; choose a divisor of {heads} (null: one per query head)"
            )
    if "hidden_act" in read:
        from glmc.models.canonical import canonical_activation

        try:
            canonical_activation(str(read["hidden_act"]))
        except ValueError as err:  # it lists the known names
            problems.append(f"{prefix}.hidden_act={read['hidden_act']}: {err}; set one of them")
    return problems + _patch_problems(model, prefix, reads, checked)


def _patch_problems(model: Any, prefix: str, reads: tuple[str, ...], checked: list[str]) -> list[str]:
    """Patches must tile the image: a remainder would be cut off without a word."""
    if "patch_size" not in reads or not {"patch_size", "image_size"} & set(checked):
        return []
    size, patch = model.image_size, model.patch_size
    if finite_number(size) and finite_number(patch) and patch >= 1 and size % patch:
        return [
            f"{prefix}.patch_size={patch}: does not divide {prefix}.image_size={size}; choose a patch size that "
            f"divides the image size (e.g. {next(p for p in range(patch, 0, -1) if size % p == 0)})"
        ]
    return []


def _widths(model: Any) -> dict[str, int]:
    sizes = {k: model[k] for k in ("hidden_size", "num_heads", "mlp_size")}
    return {**sizes, "head_size": model.hidden_size // max(model.num_heads, 1)}


def _fits_data(cfg: Config, model: Any, key: str) -> list[str]:
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


def _method_problems(cfg: Config, family: Any = None, where: str = "") -> list[str]:
    """Every method the run builds: the names, and each one's settings (the ranges its config declares).
    `family`: the endpoints' model family, whose residual classes the methods must keep to (None: not
    known, not checked); `where` names it in the message (model.family=..., or the folders)."""
    names = list(cfg.matcher.methods)
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        return [f"matcher.methods={names}: {unknown[0]} is not a method; choose from {', '.join(METHODS)}"]
    if not names:
        return [f"matcher.methods=[]: name at least one of {', '.join(METHODS)}"]
    if cfg.pairing == "universe" and cfg.multi.pairwise in METHODS:
        names = [n for n in dict.fromkeys([*names, str(cfg.multi.pairwise)])]
    problems = []
    for name in names:
        node = cfg.matcher[name]
        key = "residual_map" if "residual_map" in node else "residual"
        if family is not None and node.get(key) not in (None, "none", AUTO, *family.residual_classes) and key in node:
            problems.append(
                f"matcher.{name}.{key}={node.get(key)}: not a symmetry of {where}, whose residual "
                f"stream admits {', '.join(family.residual_classes)} only (a post-norm stream is a LayerNorm's output: "
                f"no rotation commutes with its mean and gain); use symmetry=permutation or "
                f"matcher.{name}.{key}=permutation"
            )
        problems += setting_problems(METHODS[name].schema, node, f"matcher.{name}")  # the declared ranges
    return problems


def _multi_problems(cfg: Config) -> list[str]:
    """multi.*: read by pairing=universe runs only, checked in every run (a setting nothing reads
    may as well be right)."""
    from glmc.pipeline.endpoints import endpoint_ids

    m = cfg.multi
    problems = setting_problems(MultiConfig, m, "multi")  # the ranges MultiConfig and UniverseTraining declare
    methods = list(m.methods)
    unknown = [x for x in methods if x not in MULTI_METHODS]
    if unknown or not methods:
        problems.append(f"multi.methods={methods}: choose one or more of {', '.join(MULTI_METHODS)}")
    if m.pairwise not in METHODS:
        problems.append(f"multi.pairwise={m.pairwise}: not a method; choose from {', '.join(METHODS)}")
    step = m.step
    three = cfg.pairing == "universe" and len(endpoint_ids(cfg)) <= 3  # a barycentric grid
    if RULES["grid_step"].holds(step) and three and abs(round(1 / step) * step - 1) > 1e-9:
        problems.append(
            f"multi.step={step}: the barycentric grid of up to three models needs 1 / step to be an integer "
            "(e.g. multi.step=0.1, 0.2, 0.25 or 0.5)"
        )
    return problems


def _known_keys(schema: type, node: Any) -> set[str]:
    known = {f.name for f in fields(schema)}
    if schema is TrainerConfig and not trainer_target_allowed(node):  # refused by target_problems, not imported
        return known | set(node.keys())
    if schema is TrainerConfig:  # `+trainer.<argument>=...` reaches the Trainer its _target_ names
        from hydra.utils import get_class

        try:
            target = get_class(str(node.get("_target_", TrainerConfig._target_)))
        except Exception:  # instantiate reports an unknown target with its own message
            return known | set(node.keys())
        parameters = inspect.signature(target.__init__).parameters.values()
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
            return known | set(node.keys())
        known |= {p.name for p in parameters if p.name != "self"}
    return known


def _unknown_keys(node: Any, schema: type, prefix: str) -> list[str]:
    """Keys of `node` that are not settings of `schema` (a dataclass of glmc.config), in every
    nested section: `+section.key=...` would add a key that nothing reads."""
    known = _known_keys(schema, node)
    extra = [k for k in node.keys() if k not in known]
    where = prefix[:-1] or "the config"
    problems = []
    if extra:
        names = ", ".join(f"{prefix}{k}" for k in extra)
        shown = sorted(known) if len(known) <= 40 else [*sorted(known)[:40], "..."]
        problems.append(
            f"{names}: not a setting of {where} (known: {', '.join(shown)}); "
            "remove the `+` override or fix the spelling"
        )
    hints = typing.get_type_hints(schema)
    for f in fields(schema):
        child = hints.get(f.name)
        if is_dataclass(child) and f.name in node and isinstance(node[f.name], DictConfig):
            problems += _unknown_keys(node[f.name], child, f"{prefix}{f.name}.")
    return problems


def _image_size_problems(cfg: Config, pretrained: bool = False) -> list[str]:
    """data.image_size resizes the datasets the registry marks resizable (the digits) only, never below
    their native size, and must be the size the ViT expects: the endpoint cache key holds
    model.image_size, so this also keeps resized endpoints apart from native-size ones."""
    size, info = cfg.data.image_size, dataset(cfg.data.name)
    if size is not None and not info.resizable:
        resizable = " or ".join(f"data={d.name}" for d in datasets_for() if d.resizable)
        return [
            f"data.image_size={size}: only {resizable} is resized (data={cfg.data.name} loads its images at "
            "their own size); remove the setting"
        ]
    native = info.image_size
    if size is not None and size < native:
        return [
            f"data.image_size={size}: data={info.name}'s images are {native}x{native}; use {native} or more "
            "(e.g. data.image_size=32), or null"
        ]
    if pretrained:  # the folders' image sizes: glmc.pipeline.folder_fit
        return []
    loaded = native if size is None else size
    images = family_named(str(cfg.model.family)).data_kind == IMAGES
    if info.resizable and images and cfg.model.image_size != loaded:
        return [
            f"data.image_size={size}: data={info.name} would load at {loaded}x{loaded} but model.image_size="
            f"{cfg.model.image_size}; set data.image_size={cfg.model.image_size} (or choose a model for "
            f"{loaded}x{loaded} images)"
        ]
    return []


def validate_config(cfg: Config) -> Any:
    """ConfigError listing every setting that cannot work, before any data or training; returns the
    endpoints' model family."""
    targets = target_problems(cfg)  # first: what a `_target_` names is imported by no other check
    problems, family = _problems(cfg)
    problems = targets + problems
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))
    return family
