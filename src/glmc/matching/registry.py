"""Method name -> matcher, built from the run's config."""
from __future__ import annotations

from typing import Callable

from glmc.config import Config
from glmc.matching.base import Matcher
from glmc.matching.vanilla import VanillaMatcher

MATCHERS: dict[str, Callable[[Config], Matcher]] = {
    "vanilla": lambda cfg: VanillaMatcher(),
}


def build_matcher(name: str, cfg: Config) -> Matcher:
    if name not in MATCHERS:
        raise ValueError(f"matcher.methods contains {name!r}, which is not one of {sorted(MATCHERS)}")
    return MATCHERS[name](cfg)
