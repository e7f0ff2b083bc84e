"""Two models that differ in a setting of the forward pass are refused: the norm's epsilon by the
compatibility check of glmc.align, and any setting the path takes from model A (the activation) by the
pipeline's check that every path ends at its endpoints. The epsilon itself is interpolated along a path
(a narrower model embedded with its stream kept carries its own), so such a path ends at both models."""

from __future__ import annotations

import pytest
import torch

from glmc.alignment import Alignment
from glmc.eval.barrier import path_end_mismatches
from glmc.eval.evaluator import Evaluator
from glmc.models.compatibility import check_compatible
from glmc.models.convert import to_canonical

from tiny_hf import inputs_for, tiny_vit


def _pair(eps_b: float):
    a, b = tiny_vit(seed=0), tiny_vit(seed=1)
    for m in b.modules():
        if isinstance(m, torch.nn.LayerNorm):
            m.eps = eps_b
    b.config.layer_norm_eps = eps_b
    return a, b


def test_compatibility_names_both_epsilons():
    a, b = _pair(1e-2)
    with pytest.raises(ValueError, match=r"model_b has norm epsilon 0.01, model_a has norm epsilon 1e-12"):
        check_compatible(to_canonical(a), to_canonical(b))
    check_compatible(*map(to_canonical, _pair(1e-12)))  # the same epsilon: accepted


def _ends(a, b):
    """(the problems of the canonical path between a and b, the path's losses, b's own loss)."""
    x = inputs_for(a, batch=32)
    evaluator = Evaluator([(x, torch.arange(32) % 10)], "classification", progress=False)
    own_a, own_b = evaluator.evaluate(a)[0], evaluator.evaluate(b)[0]
    lambdas = [0.0, 0.5, 1.0]
    curve = evaluator.path(Alignment(to_canonical(a), to_canonical(b)), lambdas)["loss"]
    return path_end_mismatches(lambdas, curve, own_a, own_b), curve, own_b


def test_a_path_whose_end_is_not_the_endpoint_is_reported_with_both_losses():
    # the canonical path takes A's activation for every point, so its lambda=0 is not B
    problems, _, own_b = _ends(tiny_vit(seed=0), tiny_vit(seed=1, act="relu"))
    assert len(problems) == 1 and problems[0].startswith("lambda=0 (model B)")
    assert f"endpoint {own_b:.6g}" in problems[0]
    # the same forward: both ends are the endpoints to float32 round-off
    assert _ends(tiny_vit(seed=0), tiny_vit(seed=1))[0] == []


def test_the_norm_epsilon_is_interpolated_so_the_path_ends_at_both_models():
    problems, curve, own_b = _ends(*_pair(1e-2))
    assert problems == [] and abs(curve[0] - own_b) <= 1e-5 * own_b
