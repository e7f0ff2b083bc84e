"""A matcher's `_target_` names one of the registry's classes or a class that declares the matcher interface
(subclasses glmc.matching.base.Matcher and defines match(a, b, context)); anything else is refused by name
before anything is called, by the config check and by build_matcher."""

from __future__ import annotations

import re

import pytest
import torch

from glmc.alignment import Alignment
from glmc.matching.base import Matcher
from glmc.matching.registry import build_matcher, method_config
from glmc.models.convert import to_canonical
from glmc.pipeline.validate import ConfigError, validate_config

from conftest import compose_config
from tiny_hf import tiny_vit

CALLS: list[tuple] = []


def record_call(*args, **kwargs):
    """A callable that is no matcher: naming it must not run it."""
    CALLS.append((args, kwargs))


class NotAMatcher:
    def __init__(self, **settings):
        CALLS.append(("NotAMatcher", settings))

    def match(self, a, b, context=None):
        return Alignment(a, b)


class NoMatch(Matcher):
    def __init__(self, **settings):
        self.name = settings.get("name", "no_match")


class WrongMatch(Matcher):
    def __init__(self, **settings):
        self.name = settings.get("name", "wrong_match")

    def match(self, a):
        return Alignment(a, a)


class IdentityMatcher(Matcher):
    """A user's matcher: B as it is (every setting of the node it replaces is accepted)."""

    def __init__(self, name: str = "identity", **settings):
        self.name, self.settings = name, settings

    def match(self, a, b, context=None):
        return Alignment(a, b)


def _run(target: str, method: str = "weight"):
    return compose_config("debug=fast", f"matcher.methods=[{method}]", f"matcher.{method}._target_={target}")


@pytest.mark.parametrize(
    "target,reason",
    [
        ("builtins.print", "is a builtin_function_or_method, not a matcher class"),
        (f"{__name__}.record_call", "is a function, not a matcher class"),
        ("glmc.matching.no_such_module.NoSuchMatcher", "names nothing that can be imported"),
        ("collections.OrderedDict", "is a class that does not subclass glmc.matching.base.Matcher"),
        (f"{__name__}.NotAMatcher", "is a class that does not subclass glmc.matching.base.Matcher"),
        (f"{__name__}.NoMatch", "subclasses glmc.matching.base.Matcher but defines no match(a, b, context)"),
        (f"{__name__}.WrongMatch", "does not take the matcher's arguments"),
    ],
)
def test_a_target_that_is_no_matcher_class_is_refused_by_name_before_any_call(target, reason):
    CALLS.clear()
    cfg = _run(target)
    with pytest.raises(ConfigError) as err:
        validate_config(cfg)
    message = str(err.value)
    assert f"matcher.weight._target_={target}: {reason}" in message
    assert "set it back to glmc.matching.weight.WeightMatcher" in message
    with pytest.raises(ValueError, match=re.escape(f"matcher.weight._target_={target}: {reason}")):
        build_matcher(method_config(cfg, "weight"))
    assert CALLS == []  # nothing named was called


def test_a_variant_names_its_own_registered_class():
    with pytest.raises(ConfigError, match=re.escape("set it back to glmc.matching.learned.LearnedMatcher")):
        validate_config(_run("builtins.print", "learned_perm"))


def test_the_registrys_classes_and_a_users_matcher_subclass_are_accepted():
    validate_config(compose_config("debug=fast"))  # the registry's own targets
    cfg = _run(f"{__name__}.IdentityMatcher")
    validate_config(cfg)
    matcher = build_matcher(method_config(cfg, "weight"))
    assert isinstance(matcher, IdentityMatcher) and matcher.name == "weight" and matcher.settings["max_iter"] == 15
    a, b = to_canonical(tiny_vit(seed=0)), to_canonical(tiny_vit(seed=1))
    alignment = matcher.match(a, b)
    assert alignment.model is b and torch.equal(alignment.reference.params()["head.w"], a.params()["head.w"])
