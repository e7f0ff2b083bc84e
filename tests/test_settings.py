"""One source per settings group: `glmc.align` (registry's default_method_config), the Hydra schema,
the composed run.py config and the training modules all start from the same defaults, and every
method, pairwise or multi-model, is registered once."""

from __future__ import annotations

import ast
import inspect
import sys
from dataclasses import asdict, fields

import pytest
import torch
from hydra.core.config_store import ConfigStore
from hydra.utils import get_class
from omegaconf import OmegaConf
from torch.utils.data import DataLoader, TensorDataset

from glmc.config import Config, MultiConfig
from glmc.matching.base import MatchContext
from glmc.matching.learned_module import LearnedMatchingModule, LearnedSettings
from glmc.matching.registry import (
    METHODS,
    MULTI_METHODS,
    MatcherConfig,
    build_matcher,
    build_refinement,
    default_method_config,
    method_config,
)
from glmc.matching.universe import universe_match
from glmc.matching.universe_learned import UniverseLearnedSettings, UniverseLearningModule, sample_alpha
from glmc.matching.weight import WeightMatcher
from glmc.models import to_canonical
from glmc.settings.groups import LearnedTraining, SymmetryConfig, UniverseTraining

from conftest import CONF, ROOT, compose_config
from tiny_hf import tiny_vit

# Values that conf/ sets on purpose over the schema defaults, and nothing else may differ:
# conf/config.yaml tunes learned matching for the demo ViT (REPORT.md, "Choosing the demo model"), and
# learned_perm / learned_sinkhorn / learned_dual follow matcher.learned by interpolation.
DEMO_LEARNED = {"max_steps": 600, "lr": 0.01, "lambda_scheme": "uniform", "lambda_candidates": 2}
INTENDED_MATCHER = {name: DEMO_LEARNED for name in ("learned", "learned_perm", "learned_sinkhorn", "learned_dual")}
# conf/config.yaml: run.py's universe refinement puts half its steps on an edge, near its midpoint
# (measured on digits, docs/experiments.md); the Python default (learned_universe) draws from the Dirichlet alone.
INTENDED_MULTI = {"edge_share": 0.5, "edge_lambda": "gaussian"}

LEARNED = [name for name, method in METHODS.items() if issubclass(method.schema, LearnedTraining)]
# methods that are no variant of another (a variant's class takes its base method's defaults)
BASE_METHODS = [name for name, method in METHODS.items() if method.make is method.schema]
MATCHER_GROUPS = sorted(p.stem for p in (CONF / "matcher").glob("*.yaml"))


def plain(node) -> dict:
    return OmegaConf.to_container(node, resolve=True, enum_to_str=True)


def schema_node():
    """The structured config run.py's composition starts from (the ConfigStore's `config_schema`)."""
    return ConfigStore.instance().load("config_schema.yaml").node


@pytest.fixture(scope="module")
def composed():
    return compose_config()


@pytest.mark.parametrize("name", list(METHODS))
def test_every_method_has_the_same_defaults_in_python_and_in_hydra(name, composed):
    python = plain(default_method_config(name))  # what glmc.align(a, b, name) builds
    assert python == plain(schema_node().matcher[name])
    expected = {**python, **INTENDED_MATCHER.get(name, {})}
    assert plain(composed.matcher[name]) == expected, f"conf/ changes matcher.{name} beyond the intended patches"


@pytest.mark.parametrize("group", MATCHER_GROUPS)
def test_matcher_group_files_choose_methods_and_change_no_setting(group, composed):
    cfg = compose_config(f"matcher={group}")
    for name in METHODS:
        assert plain(cfg.matcher[name]) == plain(composed.matcher[name]), f"matcher={group} sets matcher.{name}"


def test_symmetry_group_file_is_the_schema_default(composed):
    assert plain(composed.symmetry) == plain(OmegaConf.structured(SymmetryConfig))


def test_multi_settings_have_the_same_defaults_in_python_and_in_hydra(composed):
    python = {f.name: getattr(UniverseLearnedSettings(), f.name) for f in fields(UniverseTraining)}
    schema = plain(schema_node().multi)
    assert {k: schema[k] for k in python} == python
    hydra = plain(composed.multi)
    assert {k: hydra[k] for k in python} == {**python, **INTENDED_MULTI}
    assert list(composed.multi.methods) == list(MultiConfig().methods) == list(MULTI_METHODS)


def test_runtime_settings_declare_no_defaults_of_their_own():
    # the checked settings the modules run with add only `where` to the settings group
    assert set(LearnedSettings.__annotations__) == {"where"}
    assert set(UniverseLearnedSettings.__annotations__) == {"where"}
    for runtime, group in ((LearnedSettings, LearnedTraining), (UniverseLearnedSettings, UniverseTraining)):
        assert [f.name for f in fields(runtime)] == [f.name for f in fields(group)] + ["where"]
    assert (
        issubclass(MultiConfig, UniverseTraining)
        and Config.__dataclass_fields__["multi"].default_factory is MultiConfig
    )
    for method in LEARNED:
        assert issubclass(METHODS[method].schema, LearnedTraining)


@pytest.mark.parametrize(
    "module,group", [(LearnedMatchingModule, LearnedTraining), (UniverseLearningModule, UniverseTraining)]
)
def test_lightning_modules_take_their_settings_whole(module, group):
    parameters = inspect.signature(module.__init__).parameters
    assert not {f.name for f in fields(group)} & set(parameters), "a setting passed beside the settings object"
    assert parameters["settings"].default is inspect.Parameter.empty


def test_sample_alpha_defaults_are_the_settings_group_defaults():
    parameters = inspect.signature(sample_alpha).parameters
    for key in ("edge_share", "edge_lambda"):
        assert parameters[key].default == getattr(UniverseTraining, key)


@pytest.mark.parametrize("name", BASE_METHODS)
def test_matcher_constructor_defaults_agree_with_the_registry(name):
    """The matcher classes keep keyword defaults for direct use; each must equal the registry's."""
    node = plain(default_method_config(name))
    for key, parameter in inspect.signature(get_class(node["_target_"]).__init__).parameters.items():
        if parameter.default is not inspect.Parameter.empty:
            assert key in node, f"{name}: the constructor has a setting {key} the registry lacks"
            assert parameter.default == node[key], f"{name}.{key}: {parameter.default!r} != {node[key]!r}"


class Captured(Exception):
    pass


def capture(monkeypatch, module, name: str) -> dict:
    """Replace the LightningModule class `name` of `module` by a function that records the settings
    it is constructed with and stops there."""
    seen: dict = {}
    signature = inspect.signature(getattr(module, name))

    def record(*args, **kwargs):
        seen["settings"] = signature.bind(*args, **kwargs).arguments["settings"]
        raise Captured

    monkeypatch.setattr(module, name, record)
    return seen


def images(n=8):
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g)))


@pytest.mark.parametrize("source", ["python", "hydra"])
@pytest.mark.parametrize("name", LEARNED)
def test_learned_module_receives_exactly_the_configured_settings(name, source, composed, monkeypatch, tmp_path):
    node = default_method_config(name) if source == "python" else method_config(composed, name)
    matcher = build_matcher(node)
    seen = capture(monkeypatch, sys.modules[type(matcher).__module__], "LearnedMatchingModule")
    a, b = (to_canonical(tiny_vit(s, hidden=16, heads=2, mlp=32)) for s in (0, 1))
    with pytest.raises(Captured):
        matcher.match(a, b, MatchContext(data=images(), run_dir=tmp_path))
    settings = asdict(seen["settings"])
    assert settings.pop("where") == f"matcher.{name}"
    assert settings == {f.name: plain(node)[f.name] for f in fields(LearnedTraining)}


def test_universe_module_receives_exactly_the_multi_settings(composed, monkeypatch, tmp_path):
    import glmc.matching.universe_learned as universe_learned

    seen = capture(monkeypatch, universe_learned, "UniverseLearningModule")
    models = [to_canonical(tiny_vit(s, hidden=16, heads=2, mlp=32)) for s in range(3)]
    aligned = universe_match(models, WeightMatcher(), max_rounds=1)
    refine = build_refinement("learned", composed.multi)
    with pytest.raises(Captured):
        refine(aligned, MatchContext(data=images(), run_dir=tmp_path))
    settings = asdict(seen["settings"])
    assert settings.pop("where") == "multi"
    assert settings == {f.name: plain(composed.multi)[f.name] for f in fields(UniverseTraining)}
    assert build_refinement("weight", composed.multi) is None and build_refinement("vanilla", composed.multi) is None


def test_every_method_is_registered_once():
    assert [f.name for f in fields(MatcherConfig)] == ["name", "methods", *METHODS]
    for name, method in MULTI_METHODS.items():
        if method.refine is not None:  # its settings are read from multi.*
            assert {f.name for f in fields(method.settings)} <= {f.name for f in fields(MultiConfig)}, name
    # pipeline/multi.py reads the multi-model methods from the registry instead of naming them
    source = (ROOT / "src/glmc/pipeline/multi.py").read_text()
    for name in MULTI_METHODS:
        assert f'"{name}"' not in source and f"'{name}'" not in source, name


@pytest.mark.parametrize(
    "path",
    [
        "src/glmc/matching/registry.py",
        "src/glmc/ranges.py",
        *(f"src/glmc/settings/{m}.py" for m in ("groups", "methods")),
    ],
)
def test_the_registry_does_not_import_the_config_schema(path):
    tree = ast.parse((ROOT / path).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert "glmc.config" not in imported
