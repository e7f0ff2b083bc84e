"""The public API on bring-your-own HF models: convert, align, interpolate, evaluate a path."""
from __future__ import annotations

import pytest
import torch

from glmc import align, evaluate_path, interpolate, to_canonical
from glmc.models import relative_deviation
from tiny_hf import inputs_for, tiny_gpt2, tiny_vit


@pytest.mark.parametrize("build", [tiny_vit, tiny_gpt2])
def test_align_interpolate_evaluate(build):
    hf_a, hf_b = build(seed=0), build(seed=1)
    x = inputs_for(hf_a)
    canonical = to_canonical(hf_b)
    assert relative_deviation(canonical(x), hf_b(x).logits) < 1e-5  # same input, logits out

    result = align(hf_a, hf_b, matcher="weight", max_iter=5)
    assert relative_deviation(result.model(x), hf_b(x).logits) < 1e-4
    assert set(result.transform) >= {"residual", "heads.0", "mlp.0"}
    assert result.diagnostics["iterations"] <= 5

    ends = interpolate([result.reference, result.model], [1.0, 0.0])
    assert relative_deviation(ends(x), hf_a(x).logits) < 1e-4
    mid = interpolate([result.reference, result.model], [0.5, 0.5])
    assert torch.isfinite(mid(x)).all()

    targets = x if build is tiny_gpt2 else torch.arange(len(x)) % 10
    task = "causal_lm" if build is tiny_gpt2 else "classification"
    curve = evaluate_path(result.reference, result.model, [(x, targets)], [0.0, 0.5, 1.0], task, progress=False)
    assert len(curve["loss"]) == 3 and all(v > 0 for v in curve["loss"])


def test_unknown_matcher_names_the_choices():
    with pytest.raises(ValueError, match="weight_perm"):
        align(tiny_vit(), tiny_vit(seed=1), matcher="magic")
