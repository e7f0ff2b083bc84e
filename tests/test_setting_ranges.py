"""Each method setting is declared once, with its range (glmc.settings), and every check is generated
from that declaration: every out-of-range value of every declared setting is refused naming its key, by
the config check before any work, by the matcher's constructor and by the training settings; and the
config schema reads the declarations without importing a matcher."""

from __future__ import annotations

import ast
import functools
import math

import pytest
from hydra.utils import get_class
from omegaconf import OmegaConf

from glmc.config import MultiConfig
from glmc.matching.learned_module import LearnedSettings
from glmc.matching.registry import default_method_config
from glmc.matching.universe_learned import UniverseLearnedSettings
from glmc.pipeline.validate import ConfigError, validate_config
from glmc.ranges import check_settings, declared, setting
from glmc.settings.groups import LearnedTraining, UniverseTraining
from glmc.settings.methods import METHODS

from conftest import ROOT, compose_config

SCHEMAS = {**{f"matcher.{name}": method.schema for name, method in METHODS.items()}, "multi": MultiConfig}
# (where, setting, a value out of its range), for every declared setting and every value its rule names
CASES = [(where, d.name, bad) for where, schema in SCHEMAS.items() for d in declared(schema) for bad in d.outside()]
# the config check reads composed nodes: one value per numeric setting (Hydra refuses other types itself)
NUMERIC = [
    (where, d.name, d.outside()[0])
    for where, schema in SCHEMAS.items()
    for d in declared(schema)
    if d.rule is not None and d.type in (int, float)
]


def _imports(path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    return names | {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}


def test_the_config_schema_imports_no_matcher():
    imported = _imports(ROOT / "src/glmc/config.py")
    assert not [m for m in imported if m.startswith("glmc.matching")], imported
    for path in sorted((ROOT / "src/glmc/settings").glob("*.py")):  # nor does what it reads
        bad = [m for m in _imports(path) if m.startswith(("glmc.matching", "glmc.config", "torch"))]
        assert not bad, f"{path.name} imports {bad}"


def test_every_method_setting_declares_its_range():
    """The numbers and strings a method reads declare a range; only names, targets and lists do not."""
    for where, schema in SCHEMAS.items():
        ranged = {d.name for d in declared(schema)}
        free = {f for f in schema.__dataclass_fields__ if f not in ranged}
        assert free <= {"_target_", "name", "methods", "pairwise"}, f"{where}: no range declared for {free - ranged}"
    assert len(CASES) > 100 and len(NUMERIC) > 50


def _value(v) -> str:
    return "nan" if isinstance(v, float) and math.isnan(v) else str(v)


@pytest.mark.parametrize("where, key, bad", CASES, ids=[f"{w}.{k}={_value(v)}" for w, k, v in CASES])
def test_the_declaration_refuses_the_value_naming_the_key(where, key, bad):
    with pytest.raises(ValueError, match=f"^{where}.{key}="):
        check_settings(SCHEMAS[where], where, {key: bad})


@pytest.mark.parametrize("where, key, bad", NUMERIC, ids=[f"{w}.{k}={_value(v)}" for w, k, v in NUMERIC])
def test_the_config_check_refuses_the_value_naming_the_key(where, key, bad):
    methods = [] if where == "multi" else [f"matcher.methods=[{where.split('.')[1]}]"]
    cfg = compose_config("debug=fast", *methods)  # composed once per method; the value set as an override would
    OmegaConf.update(cfg, f"{where}.{key}", bad)
    with pytest.raises(ConfigError, match=f"{where}.{key}="):
        validate_config(cfg)


@functools.cache
def _defaults(name: str) -> dict:
    """Method `name`'s default settings as plain values, built once per test process (the schema takes
    tens of milliseconds to build)."""
    return OmegaConf.to_container(default_method_config(name), resolve=True)


METHOD_CASES = [(w.split(".")[1], k, v) for w, k, v in CASES if w != "multi"]


@pytest.mark.parametrize("name, key, bad", METHOD_CASES, ids=[f"{n}.{k}={_value(v)}" for n, k, v in METHOD_CASES])
def test_the_matcher_constructor_refuses_the_value_naming_the_key(name, key, bad):
    """Python callers build the classes directly: their constructors check the same declarations."""
    node = dict(_defaults(name))
    cls = get_class(node.pop("_target_"))
    with pytest.raises(ValueError, match=f"matcher.{name}.{key}="):
        cls(**{**node, key: bad})


@pytest.mark.parametrize(
    "runtime, group", [(LearnedSettings, LearnedTraining), (UniverseLearnedSettings, UniverseTraining)]
)
def test_the_training_settings_check_every_declared_range(runtime, group):
    for d in declared(group):
        for bad in d.outside():
            with pytest.raises(ValueError, match=f"^somewhere.{d.name}="):
                runtime(**{d.name: bad}, where="somewhere")
        runtime(where="somewhere")  # the defaults are in range


def test_a_declaration_names_one_range():
    with pytest.raises(ValueError, match="declare one rule"):
        setting(1, "countt")
    with pytest.raises(ValueError, match="declare one rule"):
        setting(1, "count", choices=("a",))
