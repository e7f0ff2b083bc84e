"""Checks that run before any data is loaded or any model trained.

`validate_config` refuses settings that would crash or mislead hours later (duplicate seeds, a
barrier without an interior point, empty data slices, non-positive learning rates, keys the schema
does not know). `check_run_dir` refuses to write into a folder that already holds the results of a
different config, unless `overwrite=true`; `RunFolderGuard` (a Hydra callback, conf/config.yaml) runs
the same check before Hydra writes the run's .hydra/ files into that folder.
"""

from __future__ import annotations

import copy
import json
import logging
from collections import Counter
from dataclasses import fields
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from glmc.config import Config, DataConfig, EvalConfig, MergeConfig, ModelConfig, SymmetryConfig, TrainConfig

log = logging.getLogger(__name__)

# Sections whose keys are fixed by the schema; `+section.key=...` would add a key that nothing reads
# (and, for model/data/train, one that changes the endpoint cache key).
SCHEMA_SECTIONS = {
    "model": ModelConfig,
    "data": DataConfig,
    "train": TrainConfig,
    "eval": EvalConfig,
    "merge": MergeConfig,
    "symmetry": SymmetryConfig,
}

# Keys that do not change any number in results.json: a rerun may differ in them.
NOT_RESULTS = (
    "overwrite",
    "logger",
    "cache_dir",
    "data.root",
    "data.download",
    "trainer.enable_progress_bar",
    "trainer.log_every_n_steps",
    "threads",  # how fast, not what: numbers may differ in the last bits only
)


class ConfigError(ValueError):
    """A setting that cannot work; the message names the key, its value and what to do."""


def _problems(cfg: Config) -> list[str]:
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
    if cfg.eval.num_lambdas < 3:
        problems.append(
            f"eval.num_lambdas={cfg.eval.num_lambdas}: a barrier needs a point between the endpoints; "
            "use at least 3 (11 is the default)"
        )
    if cfg.eval.cache_batches_mb < 0:
        problems.append(f"eval.cache_batches_mb={cfg.eval.cache_batches_mb}: use 0 (no cache) or a positive size")
    if not cfg.train.lr > 0:
        problems.append(f"train.lr={cfg.train.lr}: the learning rate must be positive (e.g. train.lr=3e-3)")
    if cfg.train.weight_decay < 0:
        problems.append(f"train.weight_decay={cfg.train.weight_decay}: use 0 (none) or a positive value")
    if cfg.train.max_epochs < 1:
        problems.append(f"train.max_epochs={cfg.train.max_epochs}: train for at least 1 epoch")
    for key in ("limit_train", "limit_test"):
        value = cfg.data[key]
        if value is not None and value < 1:
            problems.append(f"data.{key}={value}: keep at least 1 example, or null for the whole split")
    for key in ("batch_size", "eval_batch_size"):
        if cfg.data[key] < 1:
            problems.append(f"data.{key}={cfg.data[key]}: use a batch size of at least 1")
    problems += _image_size_problems(cfg)
    for name in cfg.matcher.methods:
        node = cfg.matcher[name] if name in cfg.matcher else None  # unknown names: check_methods says so
        if node is not None and "lr" in node and not node.lr > 0:
            problems.append(
                f"matcher.{name}.lr={node.lr}: the learning rate of {name} must be positive "
                f"(e.g. matcher.{name}.lr=0.3)"
            )
    for section, schema in SCHEMA_SECTIONS.items():
        known = {f.name for f in fields(schema)}
        extra = [k for k in cfg[section].keys() if k not in known]
        if extra:
            names = ", ".join(f"{section}.{k}" for k in extra)
            problems.append(
                f"{names}: not a setting of {section} (known: {', '.join(sorted(known))}); "
                "remove the `+` override or fix the spelling"
            )
    return problems


def _image_size_problems(cfg: Config) -> list[str]:
    """data.image_size resizes the digits only, never below their native 8x8, and must be the size
    the ViT expects: the endpoint cache key holds model.image_size, so this also keeps resized
    endpoints apart from 8x8 ones."""
    size = cfg.data.image_size
    if size is not None and cfg.data.name != "digits":
        return [
            f"data.image_size={size}: only the digits are resized (data={cfg.data.name} loads its images at "
            "their own size); remove the setting"
        ]
    if size is not None and size < 8:
        return [f"data.image_size={size}: the digits are 8x8; use 8 or more (e.g. data.image_size=32), or null"]
    loaded = 8 if size is None else size
    if cfg.data.name == "digits" and cfg.model.family == "vit" and cfg.model.image_size != loaded:
        return [
            f"data.image_size={size}: the digits would load at {loaded}x{loaded} but model.image_size="
            f"{cfg.model.image_size}; set data.image_size={cfg.model.image_size} (or choose a model for "
            f"{loaded}x{loaded} images)"
        ]
    return []


def validate_config(cfg: Config) -> None:
    """ConfigError listing every setting that cannot work, before any data or training."""
    problems = _problems(cfg)
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for k, v in node.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out if out or not prefix else {prefix[:-1]: {}}
    return {prefix[:-1]: node}


def _ignored(key: str) -> bool:
    return any(key == k or key.startswith(k + ".") for k in NOT_RESULTS)


def config_as_saved(cfg: Config) -> dict[str, Any]:
    """The resolved config as results.json stores it (plain JSON values)."""
    from glmc.pipeline.report import finite_or_none

    return json.loads(json.dumps(finite_or_none(OmegaConf.to_container(cfg, resolve=True))))


def config_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """`key: saved -> current` for every result-changing key that differs, in config order."""
    old, new = _flatten(saved), _flatten(current)
    keys = list(new) + [k for k in old if k not in new]
    missing = "<absent>"
    return [
        f"{k}: {json.dumps(old.get(k, missing))} -> {json.dumps(new.get(k, missing))}"
        for k in keys
        if not _ignored(k) and old.get(k, missing) != new.get(k, missing)
    ]


def check_run_dir(cfg: Config, run_dir: Path) -> None:
    """FileExistsError when `run_dir` holds results.json of a different config (and overwrite is false).

    The same config (up to NOT_RESULTS) may run again: it resumes learned matching from its checkpoints."""
    results = Path(run_dir) / "results.json"
    if not results.is_file():
        return
    try:
        saved = json.loads(results.read_text()).get("config")
        if not isinstance(saved, dict):
            raise ValueError("no config recorded")
        differences = config_differences(saved, config_as_saved(cfg))
    except (OSError, ValueError, AttributeError) as err:
        differences = [f"its results.json records no readable config ({err})"]
    if not differences:
        return
    shown = "; ".join(differences[:3]) + (f"; and {len(differences) - 3} more" if len(differences) > 3 else "")
    if cfg.get("overwrite", False):
        log.warning("overwrite=true: replacing the results in %s of a different config (%s)", run_dir, shown)
        return
    raise FileExistsError(
        f"{run_dir} already holds the results of a different config ({shown}): pass overwrite=true to "
        "replace them (other files there are kept), or choose another folder (hydra.run.dir=...)"
    )


class RunFolderGuard(Callback):
    """`check_run_dir` for a single run started by run.py, before Hydra saves .hydra/config.yaml there."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        run_dir = Path(str(config.hydra.run.dir))
        if not (run_dir / "results.json").is_file():
            return
        task = copy.deepcopy(config)  # the task function's config: everything but the `hydra` node
        with read_write(task), open_dict(task):
            del task["hydra"]
        check_run_dir(task, run_dir)
