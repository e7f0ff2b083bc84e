"""What a `_target_` may name, since instantiate calls whatever it names: at matcher.<method> a matcher class,
at trainer Lightning's Trainer, elsewhere a Lightning callback or plugin class. Nothing named is called, and
nothing outside `lightning` is imported."""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from glmc.matching.registry import matcher_target_problem
from glmc.settings.methods import METHODS, default_target

TARGET = "_target_"
PLAIN_REFERENCE = re.compile(r"\$\{([\w.\[\]-]+)\}")  # `${a.b}`: no resolver, so no new container
TRAINER = "lightning.pytorch.Trainer"
CALLBACKS, PLUGINS = "lightning.pytorch.callbacks.", "lightning.pytorch.plugins."
# lightning.pytorch.plugins re-exports Fabric's checkpoint IO and cluster environments
PLUGIN_MODULES = ("lightning.pytorch.plugins.", "lightning.fabric.plugins.")
FIX = {
    True: f"set it back to {TRAINER}, the only class glmc builds there",
    False: "name a callback class of lightning.pytorch.callbacks (e.g. lightning.pytorch.callbacks.EarlyStopping) "
    "or a plugin class of lightning.pytorch.plugins, or remove the node",
}


def _targets(node: Any, path: str) -> Iterator[tuple[str, Any, Any]]:
    """(key path of the node, the node, its `_target_` value) for every node below `node` that has one."""
    if isinstance(node, DictConfig):
        if TARGET in node:
            try:
                value = node[TARGET]
            except Exception as err:  # an interpolation that does not resolve
                value = f"<unresolved: {err}>"
            yield path, node, value
        for key in node.keys():
            if key != TARGET and not (path == "" and key == "hydra"):
                yield from _targets(_child(node, key), f"{path}.{key}" if path else str(key))
    elif isinstance(node, ListConfig):
        for index in range(len(node)):
            yield from _targets(_child(node, index), f"{path}[{index}]")


def _child(node: DictConfig | ListConfig, key: Any) -> Any:
    """node[key] resolved where it may be a container; None for a plain value or one that cannot be read."""
    raw = node._get_node(key)
    if not isinstance(raw, (DictConfig, ListConfig)):
        if raw is None or not raw._is_interpolation():
            return None
        reference = PLAIN_REFERENCE.fullmatch(str(raw._value()))
        if reference and not reference.group(1).startswith("hydra"):
            return None  # another node of the config, walked at its own path
    try:
        return node[key]
    except Exception:  # a missing value (???) or a broken interpolation: the schema's checks name it
        return None


def _reason(target: Any, trainer: bool) -> str | None:
    """Why `target` is refused at a node outside matcher.<method> (`trainer`: at trainer._target_)."""
    if not isinstance(target, str):
        return f"is a {type(target).__name__}, not the dotted path of a class"
    from hydra.utils import get_class

    try:  # imported only from the lightning package
        found = get_class(target) if target.startswith("lightning.") else None
    except Exception:  # not importable, or not a class
        found = None
    if trainer:
        import lightning.pytorch as pl

        return None if found is pl.Trainer else "is not Lightning's Trainer"
    if found is not None and inspect.isclass(found):
        from lightning.pytorch.callbacks import Callback

        module = found.__module__ + "."
        if target.startswith(CALLBACKS) and issubclass(found, Callback) and module.startswith(CALLBACKS):
            return None
        if target.startswith(PLUGINS) and module.startswith(PLUGIN_MODULES):
            return None
    return "is not a class glmc builds from the config"


def target_problems(cfg: DictConfig) -> list[str]:
    """One message per `_target_` of `cfg` the allow-list refuses, naming its key path and value."""
    problems = []
    for path, node, target in _targets(cfg, ""):
        head, _, rest = path.partition(".")
        if head == "matcher" and rest and "." not in rest and "[" not in rest:
            problem = matcher_target_problem(node, path, default_target(rest) if rest in METHODS else None)
            problems += [problem] if problem else []
            continue
        trainer = path == "trainer"
        reason = _reason(target, trainer)
        if reason:
            problems.append(f"{path}._target_={target}: {reason}; {FIX[trainer]}")
    return problems


def trainer_arguments(trainer: DictConfig) -> set[str] | None:
    """The keyword arguments of Lightning's Trainer; None where trainer._target_ names another class."""
    if _reason(OmegaConf.select(trainer, TARGET, default=TRAINER), trainer=True) is not None:
        return None
    import lightning.pytorch as pl

    return {name for name in inspect.signature(pl.Trainer.__init__).parameters if name != "self"}
