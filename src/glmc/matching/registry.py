"""The one registry of alignment methods, built from their settings by `instantiate`.

The methods and their settings are declared in glmc.settings.methods (METHODS, MULTI_METHODS); this
module builds a matcher from its config node, for `run.py` and `glmc.align` alike. A node's `_target_`
must name a class that subclasses `glmc.matching.base.Matcher` and defines its own `match(self, a, b,
context)`; anything else is refused by name before anything is called (`matcher_target_problem`).
No matcher and not glmc.config is imported here: `instantiate` loads the class.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from typing import Any

from omegaconf import DictConfig, OmegaConf

from glmc.settings.groups import SymmetryConfig
from glmc.settings.methods import METHODS, MULTI_METHODS, MatcherConfig, default_target


def check_multi_methods(names: list[str]) -> None:
    unknown = [n for n in names if n not in MULTI_METHODS]
    if unknown or not names:
        raise ValueError(f"multi.methods={names}: choose one or more of {', '.join(MULTI_METHODS)}")


def build_refinement(name: str, multi: Any) -> Callable[..., Any] | None:
    """Multi-model method `name`'s refinement of a universe alignment, with its settings read from the
    `multi` node (every field of the method's settings dataclass); None for a method without one."""
    import functools

    from hydra.utils import get_method

    method = MULTI_METHODS[name]
    if method.refine is None:
        return None
    values = {f.name: multi[f.name] for f in fields(method.settings)}
    return functools.partial(get_method(method.refine), where="multi", **values)


def check_methods(names: list[str]) -> None:
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        raise ValueError(f"matcher.methods contains {unknown}, which is not one of {list(METHODS)}")
    if not names:
        raise ValueError("matcher.methods is empty: name at least one of " + ", ".join(METHODS))


def method_config(cfg: DictConfig, name: str) -> DictConfig:
    """The node of method `name` inside a composed run config (interpolations resolve there)."""
    check_methods([name])
    return cfg.matcher[name]


def _locate(path: str) -> Any:
    """The object a dotted path names, imported but not called; ImportError or AttributeError if none."""
    parts = path.split(".")
    for end in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:end]))
        except ImportError:
            continue
        for attr in parts[end:]:
            found = getattr(found, attr)
        return found
    raise ImportError(f"no module of {path!r} can be imported")


def _target_reason(target: Any, keys: Iterable[str]) -> str | None:
    """Why `target` cannot be a matcher class whose constructor takes `keys`; None when it can."""
    from glmc.matching.base import Matcher

    try:
        found = _locate(str(target))
    except (ImportError, AttributeError, ValueError) as err:
        return f"names nothing that can be imported ({err})"
    if not inspect.isclass(found):
        return f"is a {type(found).__name__}, not a matcher class"
    if Matcher not in found.__mro__[1:]:
        return "is a class that does not subclass glmc.matching.base.Matcher, the matcher interface"
    match = getattr(found, "match", None)
    if match is Matcher.match or not callable(match):
        return "subclasses glmc.matching.base.Matcher but defines no match(a, b, context) of its own"
    try:
        inspect.signature(match).bind(None, "a", "b", "context")
        inspect.signature(found).bind(**dict.fromkeys(keys))
    except TypeError as err:
        return f"does not take the matcher's arguments: match(a, b, context) and the node's settings ({err})"
    return None


def matcher_target_problem(node: Any, where: str, default: str | None = None) -> str | None:
    """A message naming `where`._target_, why its value is refused and what to set instead; None if it
    names a matcher class (module docstring)."""
    target = node.get("_target_")
    reason = _target_reason(target, [k for k in node.keys() if k != "_target_"])
    if reason is None:
        return None
    back = f"set it back to {default}, the registry's class, or " if default else ""
    return (
        f"{where}._target_={target}: {reason}; {back}name a class that subclasses glmc.matching.base.Matcher "
        "and defines match(self, a, b, context)"
    )


def build_matcher(node: DictConfig) -> Any:
    """Instantiate one method's config node (`_target_` + constructor arguments), after checking that
    `_target_` names a matcher class (module docstring)."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    name = str(node.get("name", ""))
    problem = matcher_target_problem(node, f"matcher.{name}", default_target(name) if name in METHODS else None)
    if problem:
        raise ValueError(problem)
    try:
        return instantiate(node, _convert_="all")
    except InstantiationException as err:  # a bad setting: the constructor's own message names the key
        if isinstance(err.__cause__, (ValueError, TypeError)):
            raise err.__cause__ from None
        raise


@dataclass
class _MethodDefaults:
    """What method nodes interpolate from outside a run: the `symmetry` group and the other methods."""

    symmetry: SymmetryConfig = field(default_factory=SymmetryConfig)
    matcher: MatcherConfig = field(default_factory=MatcherConfig)  # type: ignore[valid-type]


def default_method_config(name: str, **options) -> DictConfig:
    """Method `name` with the schema defaults and `options` merged in, type-checked (a misspelled
    option fails naming it). Used by `glmc.align`, where no Hydra config exists."""
    root = OmegaConf.structured(_MethodDefaults)
    node = method_config(root, name)
    if options:
        OmegaConf.set_struct(root, True)
        node.merge_with(options)
    return node
