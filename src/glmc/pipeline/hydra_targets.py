"""What a command line may set under `hydra.`: Hydra builds its callbacks (and a multirun's launcher and
sweeper, and the logging handlers) from there before glmc's own allow-list (glmc.pipeline.targets) sees the
config, so run.py checks those overrides before Hydra starts. A `_target_` there names one of glmc's
callbacks or a Hydra plugin; a logging `class` (or `()`) a class of the logging package; a node that an
interpolation would bring in is refused, since it may hold a `_target_`. Group picks (hydra/launcher=...)
come from conf/ and Hydra's own configs and are not checked here. Nothing named is imported outside
`logging`."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from typing import Any

TARGET = "_target_"
GLMC_CALLBACKS = ("glmc.pipeline.run_folder.RunFolderGuard", "glmc.pipeline.sweep_report.SweepReport")
PLUGINS = ("hydra._internal.core_plugins.", "hydra_plugins.")  # Hydra builds only the plugins it found there
BUILT = ("callbacks", "launcher", "sweeper", "job_logging", "hydra_logging")  # the nodes Hydra builds from
LOGGING = ("job_logging", "hydra_logging")
FACTORY_KEYS = ("class", "()")  # what logging.config.dictConfig calls
INTERPOLATION = re.compile(r"\$\{.*\}", re.DOTALL)
FIXES = {
    "callbacks": f"hydra.callbacks may name only glmc's callbacks ({', '.join(GLMC_CALLBACKS)}): remove the override",
    "launcher": "choose a launcher by its config group instead (e.g. hydra/launcher=local_grid)",
    "sweeper": "choose a sweeper by its config group instead (hydra/sweeper=...)",
    "logging": "name a handler, formatter or filter class of the logging package (e.g. logging.FileHandler)",
    "other": "glmc builds nothing from a _target_ there: remove it",
    "interpolation": "write the value itself (an interpolation there could bring in a node with a _target_)",
}


def _leaves(value: Any, path: list[str]) -> Iterator[tuple[list[str], Any]]:
    """(key path, value) of every plain value inside `value` (dicts and lists walked), and of every value
    under a `_target_`, `class` or `()` key, whatever it holds."""
    if path[-1] in (TARGET, *FACTORY_KEYS):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, [*path, str(key)])
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _leaves(item, [*path, f"[{index}]"])
    else:
        yield path, value


def _logging_class(name: Any) -> bool:
    """`name` is a handler, formatter or filter class of the logging package."""
    import logging

    from hydra.utils import get_class

    if not isinstance(name, str) or not name.startswith("logging."):
        return False
    try:
        found = get_class(name)
    except Exception:  # not importable, or not a class
        return False
    return isinstance(found, type) and issubclass(found, (logging.Handler, logging.Formatter, logging.Filter))


def _reason(path: list[str], value: Any) -> str | None:
    """The FIXES entry refusing `value` at key path `path` (starting with "hydra"), or None."""
    node = path[1] if len(path) > 1 else None
    if isinstance(value, str) and INTERPOLATION.search(value) and (node is None or node in BUILT):
        return "interpolation"
    if path[-1] == TARGET:
        if node == "callbacks" and len(path) == 4:
            return None if value in GLMC_CALLBACKS else "callbacks"
        if node in ("launcher", "sweeper") and len(path) == 3:
            return None if isinstance(value, str) and value.startswith(PLUGINS) else node
        return "other"
    if node in LOGGING and path[-1] in FACTORY_KEYS and not _logging_class(value):
        return "logging"
    return None


def _values(override: Any) -> list[Any]:
    """The value an override sets, or each value of a sweep."""
    if not override.is_sweep_override():
        return [override.value()]
    try:
        return list(override.sweep_iterator())
    except Exception:  # a range or interval: numbers only
        return []


def hydra_override_problems(argv: list[str]) -> list[str]:
    """One message per value a `hydra.` override of the command line `argv` sets that Hydra would build
    from and glmc does not allow, naming the override, the key and the value."""
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType

    def malformed(message: str) -> None:
        raise ValueError(message)

    parser = get_args_parser()
    parser.error = malformed  # a malformed command line: Hydra's own parse says so, after this one
    try:
        args, rest = parser.parse_known_args(argv)
    except ValueError:
        return []
    reader, problems = OverridesParser.create(), []
    # overrides after an option are left over by argparse (Hydra then refuses them): checked all the same
    for arg in [*(args.overrides or []), *(a for a in rest if not a.startswith("-"))]:
        try:
            override = reader.parse_overrides([arg])[0]
        except Exception:  # Hydra's message says more
            continue
        key = override.key_or_group
        if override.type == OverrideType.DEL or override.package is not None or key.split(".")[0] != "hydra":
            continue
        for value in _values(override):
            for path, leaf in _leaves(value, key.split(".")):
                reason = _reason(path, leaf)
                if reason:
                    where = ".".join(path).replace(".[", "[")
                    problems.append(f"the override {arg} sets {where}={leaf}, which Hydra would use: {FIXES[reason]}")
    return problems


def exit_on_hydra_targets(argv: list[str]) -> None:
    """Before Hydra builds anything: print every hydra_override_problems message and exit 1."""
    problems = hydra_override_problems(argv)
    if problems:
        print("Error: " + "\n".join(problems), file=sys.stderr, flush=True)
        raise SystemExit(1)
