"""Fisher-weighted and RegMean merging of factored canonical models."""

from __future__ import annotations

import pytest
import torch

from glmc.interpolation import interpolate
from glmc.merging.fisher_regmean import (
    augmented_matrix,
    fisher_average,
    fisher_information,
    fisher_merge,
    gram_matrices,
    linear_maps,
    merged_model,
    regmean_linear,
    regmean_merge,
)
from glmc.metrics import IGNORE_INDEX
from glmc.models import canonical_forward, to_canonical

from numeric import FEW_OPS, assert_close_rel, assert_params_close_rel
from tiny_hf import inputs_for, tiny_gpt2, tiny_llama, tiny_vit

pytestmark = pytest.mark.numeric


def batches_for(model, n=3, batch=4, pad=0):
    """Random (inputs, targets) batches; for causal LM the last `pad` targets are padding."""
    out = []
    for seed in range(n):
        x = inputs_for(model.source, batch=batch, seed=seed + 10)
        if model.task == "causal_lm":
            y = x.clone()
            if pad:
                y[:, -pad:] = IGNORE_INDEX
        else:
            y = torch.randint(0, 10, (batch,), generator=torch.Generator().manual_seed(seed))
        out.append((x, y))
    return out


def pair(build, **kwargs):
    return to_canonical(build(0, **kwargs)), to_canonical(build(1, **kwargs))


# -- (a) a model merged with itself ------------------------------------------------------------
@pytest.mark.parametrize("build", [tiny_vit, tiny_gpt2, tiny_llama], ids=["vit", "gpt2", "llama"])
def test_merging_a_model_with_itself_returns_it(build):
    model = to_canonical(build(0))
    batches = batches_for(model, pad=2)
    for merged in (
        fisher_merge([model, model.clone()], batches),
        regmean_merge([model, model.clone()], batches, alpha=0.9),
        regmean_merge([model, model], batches, weights=[0.2, 0.8], alpha=1.0),
    ):
        assert_params_close_rel(merged.params(), model.params(), FEW_OPS, "merged with itself")


# -- (b) RegMean on one linear map ----------------------------------------------------------------
def test_regmean_linear_is_the_least_squares_minimiser():
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(50, 6, generator=g, dtype=torch.float64) for _ in range(3)]
    ws = [torch.randn(4, 6, generator=g, dtype=torch.float64) for _ in range(3)]
    weights = [0.2, 0.3, 0.5]
    merged = regmean_linear(ws, [x.T @ x for x in xs], weights, alpha=1.0)
    # min_W sum_i w_i ||X_i W^T - X_i W_i^T||^2 as one stacked least-squares problem
    lhs = torch.cat([w**0.5 * x for w, x in zip(weights, xs)])
    rhs = torch.cat([w**0.5 * x @ wi.T for w, x, wi in zip(weights, xs, ws)])
    want = torch.linalg.lstsq(lhs, rhs).solution.T
    assert torch.allclose(merged, want, atol=1e-10)


def test_regmean_alpha_zero_averages_columns_by_their_input_energy():
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(30, 5, generator=g, dtype=torch.float64) * torch.rand(5, generator=g) for _ in range(2)]
    ws = [torch.randn(3, 5, generator=g, dtype=torch.float64) for _ in range(2)]
    grams = [x.T @ x for x in xs]
    merged = regmean_linear(ws, grams, alpha=0.0)
    d = [gram.diagonal() for gram in grams]
    assert torch.allclose(merged, (ws[0] * d[0] + ws[1] * d[1]) / (d[0] + d[1]), atol=1e-12)


def test_regmean_linear_keeps_the_average_where_no_input_reaches():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(40, 5, generator=g, dtype=torch.float64)
    x[:, 2] = 0  # input 2 is never active: its column is not determined by the data
    ws = [torch.randn(3, 5, generator=g, dtype=torch.float64) for _ in range(2)]
    merged = regmean_linear(ws, [x.T @ x, x.T @ x], alpha=1.0)
    assert torch.allclose(merged[:, 2], (ws[0][:, 2] + ws[1][:, 2]) / 2, atol=1e-12)


# -- (c) Fisher weights -------------------------------------------------------------------------
def test_fisher_average_takes_the_value_of_the_informed_model():
    a = {"w": torch.tensor([1.0, 2.0, 3.0])}
    b = {"w": torch.tensor([5.0, 6.0, 7.0])}
    fa = {"w": torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)}
    fb = {"w": torch.tensor([2.0, 1.0, 0.0], dtype=torch.float64)}
    merged = fisher_average([a, b], [fa, fb], eps=1e-12)["w"]
    # element 0: only b is informed; element 1: equal Fisher; element 2: none, the weighted average
    assert torch.allclose(merged, torch.tensor([5.0, 4.0, 5.0]), atol=1e-6)
    weighted = fisher_average([a, b], [fa, fb], weights=[3, 1], eps=1e-12)["w"]
    assert torch.allclose(weighted, torch.tensor([5.0, 3.0, 4.0]), atol=1e-6)


def test_fisher_merge_takes_the_other_model_for_a_dead_unit():
    a, b = pair(tiny_vit, act="relu")
    with torch.no_grad():
        a.params()["blocks.0.in_b"][3] = -1e4  # unit 3 of a never fires: zero Fisher on its weights
    batches = batches_for(a)
    fa, fb = fisher_information([a, b], batches)
    assert fa["blocks.0.out_w"][:, 3].abs().max() == 0 and fa["blocks.0.in_w"][3].abs().max() == 0
    assert (fb["blocks.0.out_w"][:, 3] > 0).all()
    merged = fisher_merge([a, b], batches, eps=1e-30).params()
    want = b.params()
    assert torch.allclose(merged["blocks.0.out_w"][:, 3], want["blocks.0.out_w"][:, 3], rtol=1e-5, atol=1e-7)
    assert torch.allclose(merged["blocks.0.in_w"][3], want["blocks.0.in_w"][3], rtol=1e-5, atol=1e-7)


# -- (d) merges of two different models ----------------------------------------------------------
def _recorded_inputs(model, batches):
    """Recorded input name -> augmented rows [x; 1] of every batch (padding and ViT's non-class
    positions dropped as RegMean does)."""
    rows: dict[str, list] = {}
    for x, y in batches:
        keep = y != IGNORE_INDEX if model.task == "causal_lm" else None

        def record(name, t, keep=keep):
            if name.endswith("heads"):
                t = t.permute(0, 2, 1, 3).flatten(2)
            if name == "final" and model.config.pooling == "cls":
                t = t[:, :1]
            elif keep is not None:
                t = t[keep]
            t = t.reshape(-1, t.shape[-1]).double()
            rows.setdefault(name, []).append(torch.cat([t, t.new_ones(len(t), 1)], 1))

        with torch.no_grad():
            canonical_forward(model.config, model.params(), x, record)
    return {k: torch.cat(v) for k, v in rows.items()}


@pytest.mark.parametrize("build", [tiny_vit, tiny_gpt2, tiny_llama], ids=["vit", "gpt2", "llama"])
def test_merges_of_two_models_are_finite_and_regmean_fits_each_map(build):
    models = pair(build)
    batches = batches_for(models[0], n=4, pad=3)
    x = batches[0][0]
    shapes = {k: v.shape for k, v in models[0].params().items()}
    for kind in ("average", "fisher", "regmean"):
        merged = merged_model(kind, models, batches)
        assert {k: v.shape for k, v in merged.params().items()} == shapes, kind
        assert all(torch.isfinite(v).all() for v in merged.params().values()), kind
        assert torch.isfinite(merged(x)).all(), kind

    merged = regmean_merge(models, batches, alpha=1.0).params()
    average = interpolate(models, [0.5, 0.5]).params()
    inputs = [_recorded_inputs(m, batches) for m in models]
    params = [m.params() for m in models]

    def sse(p, linear):
        w = augmented_matrix(p, linear).double()
        cols = slice(None) if linear.bias is not None else slice(0, -1)  # no bias: x without the constant 1
        fits = [x[linear.reads][:, cols] @ (w - augmented_matrix(q, linear).double()).T for x, q in zip(inputs, params)]
        return sum((f**2).sum() for f in fits)

    maps = linear_maps(models[0])
    per_layer = 7 if "blocks.0.gate_w" in params[0] else 6  # q, k, v, o, in, out (and a gated MLP's gate)
    assert len(maps) == per_layer * models[0].num_layers + 1  # and the head
    for linear in maps.values():
        best = sse(merged, linear)
        for other in (average, *params):
            assert best <= sse(other, linear) * (1 + 1e-6) + 1e-9, linear.weight


def test_gram_matrices_drop_padding_and_read_the_class_token_only():
    gpt = to_canonical(tiny_gpt2(0))
    x = inputs_for(gpt.source, batch=3)
    padded = x.clone()
    padded[:, 8:] = IGNORE_INDEX
    full = gram_matrices([gpt], [(x, padded)])[0]
    prefix = gram_matrices([gpt], [(x[:, :8], x[:, :8])])[0]  # causal: the prefix does not see the padding
    assert full.keys() == prefix.keys()
    for name in full:
        assert_close_rel(full[name], prefix[name], FEW_OPS, f"Gram matrix {name}")
    assert full["final"][-1, -1] == 3 * 8  # the constant column counts the kept tokens

    vit = to_canonical(tiny_vit(0))
    grams = gram_matrices([vit], batches_for(vit, n=2, batch=4))[0]
    assert grams["final"][-1, -1] == 2 * 4
    assert grams["blocks.0.attn_in"][-1, -1] == 2 * 4 * 17  # 16 patches and the class token


def test_merged_model_average_is_the_uniform_interpolation():
    models = pair(tiny_vit)
    merged = merged_model("average", models)
    want = interpolate(models, [0.5, 0.5])
    got, expected = merged.params(), want.params()
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[k], expected[k]) for k in expected)  # the same computation: bit for bit


# -- (e) bad inputs -----------------------------------------------------------------------------
def test_bad_inputs_raise_value_errors():
    a, b = pair(tiny_vit)
    batches = batches_for(a, n=1)
    with pytest.raises(ValueError, match="circuit form"):
        fisher_merge([a.to_circuit(), b.to_circuit()], batches)
    with pytest.raises(ValueError, match="circuit form"):
        regmean_merge([a, b.to_circuit()], batches)
    wide = to_canonical(tiny_vit(1, mlp=48))
    with pytest.raises(ValueError, match="identical shapes"):
        regmean_merge([a, wide], batches)
    stacked = interpolate([a, b], [0.5, 0.5], circuits=("qk",))
    with pytest.raises(ValueError, match="identical shapes"):
        fisher_merge([a, stacked], batches)
    with pytest.raises(ValueError, match="weights"):
        fisher_merge([a, b], batches, weights=[1.0])
    with pytest.raises(ValueError, match="non-negative"):
        regmean_merge([a, b], batches, weights=[1.5, -0.5])
    with pytest.raises(ValueError, match="alpha"):
        regmean_merge([a, b], batches, alpha=1.5)
    with pytest.raises(ValueError, match="no models"):
        regmean_merge([], batches)
    with pytest.raises(ValueError, match="empty"):
        fisher_merge([a, b], [])
    with pytest.raises(ValueError, match="family"):
        fisher_merge([a, to_canonical(tiny_gpt2(0))], batches)
    with pytest.raises(ValueError, match="allowed.*average.*fisher.*regmean"):
        merged_model("ties", [a, b], batches)
    with pytest.raises(TypeError):
        regmean_merge([a.source, b.source], batches)
