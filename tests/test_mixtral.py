"""Mixtral (grouped-query attention, a mixture of SwiGLU experts: blocks.moe): exact conversion with and
without a sliding window, every admitted symmetry, matchers that keep B (weight, activation, learned), a
planted transform (residual map, expert order, each expert's units, heads) recovered exactly by weight
matching and not without expert reordering, an export that reloads, and run.py on two bfloat16 folders."""

import pytest
import torch

from glmc.matching.activation import ActivationMatcher
from glmc.matching.base import MatchContext
from glmc.matching.weight import weight_matching
from glmc.models import to_canonical
from glmc.models.export import export_hf
from glmc.symmetry import SymmetrySpec, Transform, apply

from family_checks import (
    EXPERTS,
    HEADS,
    ROTARY_QK,
    STREAM,
    VO,
    alignment_tests,
    assert_export_reloads,
    bfloat16_folders_test,
    canonical_fixture,
    next_token_data,
    symmetry_tests,
)
from numeric import FEW_OPS, assert_close_rel
from tiny_hf import inputs_for, tiny_mixtral

pytestmark = pytest.mark.numeric


@pytest.mark.parametrize("window", [None, 4], ids=["full", "window"])
def test_conversion_matches_hf(window):
    hf = tiny_mixtral(window=window)
    model, x = to_canonical(hf), inputs_for(hf)
    assert x.shape[1] > (window or 0)  # longer than the window: the mask matters
    assert (model.config.sliding_window, model.config.block_settings["experts_top_k"]) == (window, 2)
    with torch.no_grad():
        assert_close_rel(model(x), hf(x).logits, FEW_OPS, "canonical vs HF logits")


# Llama's, with the gated MLP's unit spaces replaced by the experts' (blocks/moe.py says why)
CASES = STREAM | HEADS | ROTARY_QK | VO | EXPERTS


canonical = canonical_fixture(tiny_mixtral, window=4)
test_the_cases_are_what_the_spec_claims, test_symmetry_preserves_function = symmetry_tests(CASES)


# every matcher orders the experts (learned matching keeps weight matching's order, learns the rest)
pair, test_alignment_keeps_b = alignment_tests(
    tiny_mixtral, mapped={"heads", "qheads", "experts", "expert_units"}, unmapped={"mlp"}
)


def test_a_planted_transform_is_recovered_exactly_and_only_with_expert_reordering():
    a = to_canonical(tiny_mixtral(seed=3))
    classes = {"residual": "orthogonal", "heads": "permutation", "qheads": "permutation"}
    classes |= {"experts": "permutation", "expert_units": "permutation"}
    planted = Transform.sample(SymmetrySpec.from_model(a), classes, torch.Generator().manual_seed(0))
    assert any(not torch.equal(g.perm, torch.arange(4)) for n, g in planted.items() if n.startswith("experts."))
    b = apply(planted, a)

    def worst(experts: bool) -> float:
        transform, _ = weight_matching(a, b, max_iter=5, options={"experts": "permutation" if experts else "fixed"})
        aligned = {k: v.detach() for k, v in apply(transform, b).params().items()}
        return max(float((aligned[k] - v.detach()).abs().max() / v.abs().max()) for k, v in a.params().items())

    assert worst(True) < 1e-5
    assert worst(False) > 1e-2


def test_activation_matching_finds_a_planted_expert_order_and_units(tmp_path):
    a = to_canonical(tiny_mixtral(seed=3))
    classes = {"experts": "permutation", "expert_units": "permutation", "heads": "permutation"}
    b = apply(Transform.sample(SymmetrySpec.from_model(a), classes, torch.Generator().manual_seed(1)), a)
    data = next_token_data(61)
    alignment = ActivationMatcher(batches=2).match(a, b, MatchContext(data=data, run_dir=tmp_path))
    aligned = alignment.model.params()
    for name in ("router_w", "expert_gate_w", "expert_out_w"):
        assert torch.allclose(aligned[f"blocks.1.{name}"], a.params()[f"blocks.1.{name}"]), name


def test_export_reloads_and_matches(tmp_path):
    hf = tiny_mixtral(window=4)
    assert_export_reloads(hf, tmp_path, kept=("model.layers.1.mlp.experts.down_proj",))


def test_a_template_with_other_experts_is_refused(tmp_path):
    model = to_canonical(tiny_mixtral())
    with pytest.raises(ValueError, match="blocks.0.router_w: canonical shape \\(4, 32\\) but the template has"):
        export_hf(model, tiny_mixtral(experts=3), tmp_path / "out")


test_command_line_on_two_bfloat16_folders = bfloat16_folders_test(
    "mixtral",
    {"attention": "grouped", "mlp": "moe", "head_spaces": ["qk", "vo"]},
    hidden_act="silu",
    max_positions=16,
    num_experts=4,
)
