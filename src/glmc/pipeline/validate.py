"""The check before any work: `validate_config` asks each part of a run (settings, data, models or folders,
methods, Trainer, `_target_`s, unknown keys) what in the config cannot work."""

from __future__ import annotations

import typing
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from glmc.config import (
    Config,
    EndpointsConfig,
    EvalConfig,
    MergeConfig,
    MultiConfig,
    PlaneConfig,
    TrainConfig,
    TrainerConfig,
)
from glmc.data.checks import data_problems
from glmc.models.compatibility import residual_class_problem
from glmc.models.families import family_named
from glmc.pipeline.endpoint_modes import endpoint_mode_problems
from glmc.pipeline.model_checks import fits_data, model_key_problems, model_problems
from glmc.pipeline.pairing import seed_pairs, seed_problems
from glmc.pipeline.targets import target_problems, trainer_arguments
from glmc.pipeline.wandb_login import wandb_login_problems
from glmc.ranges import RULES, setting_problems
from glmc.safe_files import symlink_loop, unwritable
from glmc.settings.methods import METHODS, MULTI_METHODS
from glmc.threads import check_threads

# endpoints of different widths (endpoint_models) share these with the first, and the keys their
# family names (and the family, which every endpoint's data fixes): only the widths differ. A canonical
# path takes its norm eps from the first model, so eps is shared too
SHARED_MODEL_KEYS = ("num_layers", "hidden_act", "layer_norm_eps")
# what is embedded into the first endpoint's shapes may not be larger there
WIDTHS = ("hidden_size", "num_heads", "mlp_size", "head_size")


class ConfigError(ValueError):
    """A setting that cannot work; the message names the key, its value and what to do."""


# (key, whether a value holds, what to do) for the run's settings that no rule of RULES says
RUN_CHECKS = (
    ("threads", lambda v: check_threads(v) is None, "use auto, a count of at least 1, or null for torch's default"),
    ("seed_fixed", RULES["seed"].holds, RULES["seed"].fix),
    (
        "eval.num_lambdas",
        lambda v: v >= 3,
        "a barrier needs a point between the endpoints; use at least 3 (11 is the default)",
    ),
    ("eval.cache_batches_mb", lambda v: v >= 0, "use 0 (no cache) or a positive size"),
    ("eval.plane.grid", lambda v: v >= 2, "a plane's lattice needs at least 2 points a side (11 is the default)"),
    ("train.lr", RULES["positive"].holds, "the learning rate must be positive and finite (e.g. train.lr=3e-3)"),
    ("train.max_epochs", lambda v: v >= 1, "train for at least 1 epoch"),
    ("train.early_stopping_patience", lambda v: v is None or v >= 0, "use 0 or more, or null for no early stopping"),
)


def _run_problems(cfg: Config) -> list[str]:
    values = [(key, OmegaConf.select(cfg, key), holds, fix) for key, holds, fix in RUN_CHECKS]
    problems = [f"{key}={value}: {fix}" for key, value, holds, fix in values if not holds(value)]
    problems += setting_problems(TrainConfig, cfg.train, "train")  # the ranges declared with the settings
    problems += setting_problems(EndpointsConfig, cfg.endpoints, "endpoints")
    problems += setting_problems(PlaneConfig, cfg.eval.plane, "eval.plane")
    problems += setting_problems(EvalConfig, cfg.eval, "eval")  # eval.layerwise
    problems += wandb_login_problems(cfg)  # else W&B fails only after the endpoints trained
    return problems + setting_problems(MergeConfig, cfg.merge, "merge")


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
        problems += [refusal for key, refusal in TRAINED_ONLY if OmegaConf.select(cfg, key)]
        cfg = evaluation_config(cfg)  # the data as the run reads them: text with the folders' tokenizer
    else:
        family = family_named(str(cfg.model.family))
        where = f"model.family={family.name}"
        problems = seed_problems(list(cfg.seeds), str(cfg.pairing)) + _path_problems(cfg)
        if cfg.endpoints.paths:
            problems.append(
                f"endpoints.paths={list(cfg.endpoints.paths)}: model folders are read with endpoints=pretrained only; "
                "add endpoints=pretrained, or leave endpoints.paths empty to train the endpoints from seeds"
            )
    problems += _run_problems(cfg) + endpoint_mode_problems(cfg) + data_problems(cfg, pretrained)
    if not pretrained:  # the folders' models are checked against the data by folder_problems
        # endpoint_models in another mode: refused by endpoint_mode_problems, not checked against the seeds
        trained = str(cfg.endpoints.source) == "trained"
        problems += model_problems(cfg) + (_endpoint_model_problems(cfg) if trained else [])
    problems += _method_problems(cfg, family, where)
    problems += _multi_problems(cfg)
    from glmc.pipeline.series import series_problems  # train.save_steps: imports the endpoint stage

    problems += series_problems(cfg)
    from glmc.train.trainer import trainer_problems  # Lightning: imported where a Trainer is checked

    problems += trainer_problems(cfg)
    problems += _unknown_keys(cfg, Config, "")
    return problems, family


LOOP = "a symbolic link on this path leads back to itself (a loop), so nothing can be read or written there"


# the data's folder settings, each with what to give instead of a path that loops (data.path, a file, is
# checked by the dataset that reads it: glmc.data.text_file)
DATA_PATHS = (
    ("root", "the folder holding the datasets"),
    ("tokenizer_path", "the folder of the saved tokenizer itself"),
)


def _data_loops(cfg: Config) -> list[str]:
    """data.root and data.tokenizer_path (pretrain.data's too, where it pretrains) that loop."""
    nodes = ["data", "pretrain.data"] if OmegaConf.select(cfg, "pretrain.enabled") else ["data"]
    return [
        f"{node}.{key}={value}: {LOOP}; remove the link or set {node}.{key}=<{instead}>"
        for node in nodes
        for key, instead in DATA_PATHS
        if (value := OmegaConf.select(cfg, f"{node}.{key}")) and symlink_loop(str(value))
    ]


def _path_problems(cfg: Config) -> list[str]:
    """The run's paths that loop, and a cache_dir that cannot be written."""
    if str(cfg.endpoints.source) == "pretrained":
        return _data_loops(cfg) + [
            f"endpoints.paths[{i}]={path}: {LOOP}; remove the link or give the model folder itself"
            for i, path in enumerate(cfg.endpoints.paths)
            if symlink_loop(str(path))
        ]
    return _data_loops(cfg) + _cache_dir_problems(cfg)


def _cache_dir_problems(cfg: Config) -> list[str]:
    """A cache_dir that loops or cannot be written (the cache takes a lock even to load)."""
    key, path = f"cache_dir={cfg.cache_dir}", Path(str(cfg.cache_dir)).expanduser()
    kind, existing, reason = unwritable(path) or ("", path, "")
    if kind == "loop":
        return [f"{key}: {LOOP}; remove the link or set cache_dir=<another folder>"]
    if kind == "file":
        what = "is a file" if existing == path else f"cannot be created: {existing} is a file"
        return [f"{key}: {what}, not a folder; set cache_dir=<a folder> to cache the trained endpoints in"]
    if kind == "denied":
        what = "is not writable" if existing == path else f"cannot be created in {existing}"
        return [
            f"{key}: {what} ({reason}); the trained endpoints are cached there: make it writable or set "
            "cache_dir=<a writable folder>"
        ]
    return []


# settings of trained endpoints that an endpoints=pretrained run cannot honour: (key, refusal where set)
TRAINED_ONLY = (
    (
        "endpoint_models",
        "endpoint_models: read with endpoints=trained only; the folders of endpoints.paths bring their own "
        "models (leave endpoint_models empty)",
    ),
    (
        "pretrain.enabled",
        "pretrain.enabled=true: fine-tunes trained endpoints from a pretrained model; endpoints=pretrained "
        "trains nothing (set pretrain.enabled=false)",
    ),
)


def _endpoint_model_problems(cfg: Config) -> list[str]:
    """endpoint_models against the first, which every narrower endpoint is embedded into."""
    problems, entries = [], list(cfg.endpoint_models or [])
    if entries and len(entries) != len(cfg.seeds):
        return [
            f"endpoint_models has {len(entries)} entries for {len(cfg.seeds)} seeds: give one per seed "
            "({} keeps the shared model)"
        ]
    if not entries:
        return []
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
            problems.append(f"{(str(err).splitlines() or [''])[0]}; endpoint_models[{index}] takes the keys of model")
    if len(models) < len(entries):
        return problems
    where = [f"endpoint_models[{i}] (seed {s})" for i, s in enumerate(cfg.seeds)]
    shared = cfg.model
    for index, model in enumerate(models):  # what the shared model's checks have not covered
        problems += model_key_problems(model, f"{where[index]}: model", set(entries[index]))
        if (model.family, model.max_positions) != (shared.family, shared.max_positions):
            problems += fits_data(cfg, model, f"{where[index]}: model")
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
    except ValueError:  # seed_problems names it
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

        problems += [
            f"{where[b]} ({models[b].family}) cannot be embedded exactly into {where[a]}, which it is aligned to: "
            f"{problem}; choose endpoint_models whose heads the first model's hold"
            for problem in planned_width_problems(str(models[a].family), models[a], models[b])
        ]
    return problems


def _widths(model: Any) -> dict[str, int]:
    sizes = {k: model[k] for k in ("hidden_size", "num_heads", "mlp_size")}
    return {**sizes, "head_size": model.hidden_size // max(model.num_heads, 1)}


def _method_problems(cfg: Config, family: Any = None, where: str = "") -> list[str]:
    """Every method the run builds: its name, declared ranges and residual class against `family` (`where`)."""
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
        problem = family and residual_class_problem(family, node.get(key), f"matcher.{name}.{key}", where)
        problems += [problem] if problem else []
        problems += setting_problems(METHODS[name].schema, node, f"matcher.{name}")  # the declared ranges
    return problems


def _multi_problems(cfg: Config) -> list[str]:
    """multi.*: read by pairing=universe runs only, checked in every run."""
    from glmc.pipeline.endpoints import endpoint_ids

    m = cfg.multi
    problems = setting_problems(MultiConfig, m, "multi")  # the ranges MultiConfig and UniverseTraining declare
    methods = list(m.methods)
    if not methods or set(methods) - set(MULTI_METHODS):
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


def _unknown_keys(node: Any, schema: type, prefix: str) -> list[str]:
    """Keys `+section.key=...` added to `node` that no setting of `schema` reads, in every section."""
    known = {f.name for f in fields(schema)}
    if schema is TrainerConfig:  # and the Trainer's own arguments (any key where its target is refused)
        arguments = trainer_arguments(node)
        known |= set(node.keys()) if arguments is None else arguments
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


def validate_config(cfg: Config) -> Any:
    """ConfigError listing every setting that cannot work; returns the endpoints' model family."""
    targets = target_problems(cfg)  # first: what a `_target_` names is imported by no other check
    from glmc.pipeline.series import folder_series_configs

    configs, problems = folder_series_configs(cfg)  # a series of folders: every step's folders are checked
    family = None
    for step in [] if problems else configs:
        found, family = _problems(step)
        problems += [p for p in found if p not in problems]
    if targets + problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(targets + problems))
    return family
