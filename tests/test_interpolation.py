"""Interpolation of canonical models: circuits as stacked heads for any number of models."""

from __future__ import annotations

import pytest
import torch

from glmc.interpolation import interpolate, merge_params
from glmc.models import canonical_forward, to_canonical
from glmc.models.canonical import circuit_params

from numeric import FEW_OPS, FORWARD, assert_close_rel
from tiny_hf import inputs_for, tiny_gpt2, tiny_vit

pytestmark = pytest.mark.numeric


@pytest.mark.parametrize("build", [tiny_vit, tiny_gpt2])
def test_stacked_heads_equal_explicit_circuits_for_three_models(build):
    models = [to_canonical(build(seed)) for seed in range(3)]
    x = inputs_for(models[0].source)
    circuits = [circuit_params(m.params()) for m in models]
    circuit_config = models[0].to_circuit().config
    for weights in ([0.2, 0.3, 0.5], [1.0, 0.0, 0.0], [0.0, 0.6, 0.4]):
        stacked = merge_params([m.params() for m in models], weights, ("qk", "vo"))
        explicit = {k: sum(w * c[k] for w, c in zip(weights, circuits)) for k in circuits[0]}
        want = canonical_forward(circuit_config, explicit, x)
        got = canonical_forward(models[0].config, stacked, x)
        assert_close_rel(got, want, FORWARD, f"stacked heads vs explicit circuits at {weights}")
        kept = sum(w > 0 for w in weights)  # weight-0 models are left out of the heads
        assert stacked["blocks.0.q_w"].shape[1] == kept * models[0].params()["blocks.0.q_w"].shape[1]


def test_one_pair_as_circuit_the_other_factored():
    a, b = to_canonical(tiny_vit(0)), to_canonical(tiny_vit(1))
    x = inputs_for(a.source)
    merged = merge_params([a.params(), b.params()], [0.5, 0.5], ("qk",))
    ca, cb = circuit_params(a.params()), circuit_params(b.params())
    assert merged["blocks.0.v_w"].shape == a.params()["blocks.0.v_w"].shape  # values averaged as weights
    v_mean = 0.5 * a.params()["blocks.0.v_w"] + 0.5 * b.params()["blocks.0.v_w"]
    assert_close_rel(merged["blocks.0.v_w"], v_mean, FEW_OPS, "averaged values")
    q, k = merged["blocks.0.q_w"], merged["blocks.0.k_w"]
    qb, kb = merged["blocks.0.q_b"], merged["blocks.0.k_b"]
    aug = lambda w, bias: torch.cat([w, bias[..., None]], -1)  # noqa: E731
    qk = aug(q, qb).transpose(1, 2) @ aug(k, kb)
    assert_close_rel(qk, 0.5 * ca["blocks.0.qk"] + 0.5 * cb["blocks.0.qk"], FEW_OPS, "stacked QK circuit")
    assert torch.isfinite(canonical_forward(a.config, merged, x)).all()


def test_circuit_weights_must_be_non_negative_and_pairs_known():
    a, b = to_canonical(tiny_vit(0)), to_canonical(tiny_vit(1))
    with pytest.raises(ValueError, match="non-negative"):
        merge_params([a.params(), b.params()], [1.5, -0.5], ("qk", "vo"))
    with pytest.raises(ValueError, match="qk"):
        merge_params([a.params(), b.params()], [0.5, 0.5], ("heads",))
    extrapolated = interpolate([a, b], [1.5, -0.5])  # factored: any affine combination
    head = 1.5 * a.params()["head.w"] - 0.5 * b.params()["head.w"]
    assert_close_rel(extrapolated.params()["head.w"], head, FEW_OPS, "extrapolated head")
