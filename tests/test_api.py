"""The public API on bring-your-own HF models: convert, align (every method by name), interpolate,
evaluate a path."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from glmc import align, evaluate_path, interpolate, to_canonical
from glmc.matching.registry import METHODS
from glmc.symmetry import Orthogonal, Permutation

from numeric import FORWARD, assert_close_rel
from tiny_hf import inputs_for, tiny_gpt2, tiny_vit


@pytest.mark.numeric
@pytest.mark.parametrize("build", [tiny_vit, tiny_gpt2])
def test_align_interpolate_evaluate(build):
    hf_a, hf_b = build(seed=0), build(seed=1)
    x = inputs_for(hf_a)
    canonical = to_canonical(hf_b)
    assert_close_rel(canonical(x), hf_b(x).logits, FORWARD, "canonical B vs B logits")  # same input, logits out

    result = align(hf_a, hf_b, matcher="weight", max_iter=5)
    assert_close_rel(result.model(x), hf_b(x).logits, FORWARD, "aligned B vs B logits")
    assert set(result.transform) >= {"residual", "heads.0", "mlp.0"}
    assert result.diagnostics["iterations"] <= 5

    ends = interpolate([result.reference, result.model], [1.0, 0.0])
    assert_close_rel(ends(x), hf_a(x).logits, FORWARD, "lambda = 1 vs A logits")
    mid = result.interpolate(0.5)  # attention interpolated as circuits: heads of twice the width
    assert mid.blocks[0]["q_w"].shape[1] == 2 * result.model.blocks[0]["q_w"].shape[1]
    assert torch.isfinite(mid(x)).all()

    targets = x if build is tiny_gpt2 else torch.arange(len(x)) % 10
    task = "causal_lm" if build is tiny_gpt2 else "classification"
    curve = evaluate_path(result, None, [(x, targets)], [0.0, 0.5, 1.0], task, progress=False)
    assert len(curve["loss"]) == 3 and all(v > 0 for v in curve["loss"])
    # the path's middle is the interpolated model, its ends the endpoints
    mid_loss = evaluate_path(mid, mid, [(x, targets)], [1.0], task, progress=False)["loss"][0]
    assert curve["loss"][1] == pytest.approx(mid_loss, rel=1e-5)


def test_every_registered_method_runs_by_name(tmp_path):
    hf_a, hf_b = tiny_vit(seed=0, hidden=16, heads=2, mlp=32), tiny_vit(seed=1, hidden=16, heads=2, mlp=32)
    g = torch.Generator().manual_seed(0)
    data = DataLoader(
        TensorDataset(torch.randn(64, 1, 8, 8, generator=g), torch.randint(0, 10, (64,), generator=g)), batch_size=32
    )
    x = next(iter(data))[0]
    learned_options = dict(max_steps=3, lr=0.01, checkpoint_every=2)
    trainer = {"accelerator": "cpu", "enable_progress_bar": False}
    for name in METHODS:
        options = learned_options if name.startswith("learned") else {}
        result = align(hf_a, hf_b, matcher=name, data=data, run_dir=tmp_path / name, trainer=trainer, **options)
        if result.function_preserving:
            logits = result.model(x).logits if name == "vanilla" else result.model(x)
            assert_close_rel(logits, hf_b(x).logits, FORWARD, f"{name}: aligned B vs B logits")
        if name.startswith("learned"):
            assert result.diagnostics["steps"] == 3, name
            assert any((tmp_path / name).glob("pair_*/checkpoints/last.ckpt")), name
    learned = align(hf_a, hf_b, matcher="learned", data=data, trainer=trainer, **learned_options)
    assert {type(g) for g in learned.transform.values()} == {Orthogonal, Permutation}


def test_learned_needs_data_and_checks_its_options():
    hf_a, hf_b = tiny_vit(seed=0), tiny_vit(seed=1)
    with pytest.raises(ValueError, match="data="):
        align(hf_a, hf_b, matcher="learned", max_steps=1)
    with pytest.raises(Exception, match="max_stepz"):
        align(hf_a, hf_b, matcher="learned", max_stepz=1)
    with pytest.raises(ValueError, match="matcher.learned.lr"):
        align(hf_a, hf_b, matcher="learned", lr=-1.0)


def test_unknown_matcher_names_the_choices():
    with pytest.raises(ValueError, match="weight_perm"):
        align(tiny_vit(), tiny_vit(seed=1), matcher="magic")
