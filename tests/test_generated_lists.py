"""One matcher interface for the registry's classes and a user's, and the lists that repeat a registry
(the data.name choices, the sweep over every method) generated from it."""

from __future__ import annotations

import importlib

import pytest

from glmc.matching.base import Matcher
from glmc.matching.registry import _MethodDefaults, matcher_target_problem
from glmc.settings.methods import METHODS, default_target


@pytest.mark.parametrize("name", list(METHODS))
def test_every_registered_matcher_subclasses_the_interface_and_passes_the_users_check(name, monkeypatch):
    from omegaconf import OmegaConf

    module, cls = default_target(name).rsplit(".", 1)
    found = getattr(importlib.import_module(module), cls)
    assert Matcher in found.__mro__ and found.match is not Matcher.match
    node = OmegaConf.structured(_MethodDefaults).matcher[name]
    assert matcher_target_problem(node, f"matcher.{name}") is None
    # the same check refuses the class once it drops the interface: no registry shortcut lets it through
    monkeypatch.setattr(found, "match", Matcher.match)
    assert "defines no match(a, b, context) of its own" in matcher_target_problem(node, f"matcher.{name}")


def test_the_matchers_sweep_names_no_method_and_expands_the_registry():
    from omegaconf import OmegaConf

    from conftest import CONF

    path = CONF / "sweep" / "matchers.yaml"
    assert not [name for name in METHODS if f"[{name}]" in path.read_text()]  # no list beside the registry
    params = OmegaConf.load(path).hydra.sweeper.params  # the resolver comes from register_configs (conftest)
    assert params["matcher.methods"] == ",".join(f"[{name}]" for name in METHODS)
