"""A setting's range, declared beside it (`setting(15, "count")`, choices, or an enum type), and its checks."""

from __future__ import annotations

import dataclasses
import enum
import math
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

SEED_LIMIT = 2**32  # numpy, sklearn and Lightning take seeds in [0, 2^32)


def finite_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True)
class Rule:
    """A range: whether a value is in it, what to use instead (`{key}`: the setting), values out of it."""

    holds: Callable[[Any], bool]
    fix: str
    outside: tuple[Any, ...]


INF, NAN = float("inf"), float("nan")
RULES: dict[str, Rule] = {
    "positive": Rule(lambda v: finite_number(v) and v > 0, "use a finite number > 0", (0, -1, INF, NAN)),
    "nonnegative": Rule(lambda v: finite_number(v) and v >= 0, "use a finite number >= 0 (0: none)", (-1, INF, NAN)),
    "fraction": Rule(lambda v: finite_number(v) and 0 <= v < 1, "use a value in [0, 1)", (-1, 1, 1.5, NAN)),
    "share": Rule(lambda v: finite_number(v) and 0 <= v <= 1, "use a value in [0, 1]", (-1, 2, 1.5, NAN)),
    "count": Rule(lambda v: finite_number(v) and v >= 1, "use at least 1", (0, -1)),
    "count0": Rule(lambda v: finite_number(v) and v >= 0, "use 0 or more", (-1,)),
    "seed": Rule(
        lambda v: finite_number(v) and 0 <= v < SEED_LIMIT,
        f"use a seed in [0, 2^32) (0 to {SEED_LIMIT - 1})",
        (-1, SEED_LIMIT),
    ),
    "lr": Rule(
        lambda v: finite_number(v) and v > 0,
        "the learning rate must be positive and finite (e.g. {key}=0.3)",
        (0, -1, INF, NAN),
    ),
    "batches_or_all": Rule(lambda v: finite_number(v) and v >= -1, "use -1 (all), 0 (off) or more", (-2,)),
    "grid_step": Rule(
        lambda v: finite_number(v) and 0 < v <= 1, "use a grid step in (0, 1] (e.g. {key}=0.1)", (0, -1, 1.5, NAN)
    ),
    "flag": Rule(lambda v: isinstance(v, bool), "use true or false", ("yes",)),
    "steps": Rule(
        lambda v: all(finite_number(s) and s >= 0 for s in v) and list(v) == sorted(set(v)),
        "use optimizer steps >= 0 in increasing order, each once (e.g. {key}=[0,10,50])",
        ([-1], [10, 0], [0, 0]),
    ),
}


def setting(default: Any = dataclasses.MISSING, rule: str | None = None, *, choices: tuple[str, ...] = ()) -> Any:
    """A dataclass field with its range: a rule of RULES, or the strings it may take."""
    if (rule is None) == (not choices) or (rule is not None and rule not in RULES):
        raise ValueError(f"declare one rule of {', '.join(RULES)}, or choices (got {rule!r}, {choices!r})")
    metadata = {"range": rule} if rule else {"choices": tuple(choices)}
    if isinstance(default, list):  # a fresh list per instance
        return dataclasses.field(default_factory=lambda: list(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@dataclass(frozen=True)
class Declared:
    """One field's declared range: a rule, or choices (an enum's values, or those of `setting`)."""

    name: str
    rule: Rule | None
    choices: tuple[str, ...]
    type: Any

    def problem(self, key: str, value: Any) -> str | None:
        if self.rule is not None:
            return None if self.rule.holds(value) else f"{key}={value}: {self.rule.fix.format(key=key)}"
        shown = value.value if isinstance(value, enum.Enum) else value
        return None if str(shown) in self.choices else f"{key}={shown}: choose one of {', '.join(self.choices)}"

    def outside(self) -> tuple[Any, ...]:
        """Values out of range that a setting of this type takes (an int setting: the ints only)."""
        if self.rule is None:
            return ("no_such_choice",)
        values = self.rule.outside
        ints = tuple(v for v in values if isinstance(v, int) and not isinstance(v, bool))
        return ints if self.type is int else values


def declared(schema: type) -> list[Declared]:
    """The fields of dataclass `schema` that declare a range (by `setting` or an enum type), in order."""
    hints = typing.get_type_hints(schema)
    out = []
    for f in dataclasses.fields(schema):
        kind = hints.get(f.name)
        if "range" in f.metadata:
            out.append(Declared(f.name, RULES[f.metadata["range"]], (), kind))
        elif "choices" in f.metadata:
            out.append(Declared(f.name, None, f.metadata["choices"], kind))
        elif isinstance(kind, type) and issubclass(kind, enum.Enum):
            out.append(Declared(f.name, None, tuple(str(m.value) for m in kind), kind))
    return out


def setting_problems(schema: type, values: Mapping[str, Any], where: str) -> list[str]:
    """`<where>.<key>=<value>: <fix>` for every declared setting of `schema` in `values` that is out of range."""
    found = (d.problem(f"{where}.{d.name}", values[d.name]) for d in declared(schema) if d.name in values)
    return [problem for problem in found if problem]


def check_settings(schema: type, where: str, values: Mapping[str, Any]) -> None:
    """ValueError naming the first declared setting of `schema` in `values` that is out of range."""
    problems = setting_problems(schema, values, where)
    if problems:
        raise ValueError(problems[0])
