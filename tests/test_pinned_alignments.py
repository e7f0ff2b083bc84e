"""The pairwise matchers' paths on a tiny ViT and a tiny GPT-2 pair equal the recorded ones (pinned_alignments.py).

A refactoring must not move these numbers. The models are float64, the evaluation float32: the
tolerance is relative to the loss, far above float32 rounding of one forward pass and far below what a
different permutation or a different learned step would change.
"""

from __future__ import annotations

import json

import pytest
from pinned_alignments import METHODS, PINNED, compute

RTOL = 1e-5


@pytest.fixture(scope="module")
def recorded():
    return json.loads(PINNED.read_text())


@pytest.mark.numeric
@pytest.mark.parametrize("kind", ["vit", "gpt2"])
def test_every_matcher_gives_the_recorded_path(kind, recorded):
    now = compute(kind)
    assert set(now) == set(METHODS) == set(recorded[kind])
    for method, losses in recorded[kind].items():
        for lam, (want, got) in enumerate(zip(losses, now[method])):
            assert abs(got - want) <= RTOL * abs(want), f"{kind} {method} point {lam}: {got} != recorded {want}"
