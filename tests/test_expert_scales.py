"""Each expert's unit up/down scales (space expert_scale of blocks.moe, one diagonal per expert): declared
after the units, recovered exactly with the experts' order, units, heads and residual map from a planted
transform of tiny Mixtral, OLMoE, Qwen2-MoE (with a shared expert) and Qwen3-MoE models by weight matching
(and with the experts' order fixed) and by activation matching; kept by learned matching; no hole left in
the audit."""

import pytest
import torch

import glmc
from glmc.matching.activation import ActivationMatcher
from glmc.matching.base import MatchContext
from glmc.matching.learned import kept_spaces
from glmc.matching.weight import weight_matching
from glmc.models import to_canonical
from glmc.symmetry import SymmetrySpec, Transform, apply

from family_checks import next_token_data
from tiny_hf import tiny_mixtral, tiny_olmoe, tiny_qwen2_moe, tiny_qwen3_moe

pytestmark = pytest.mark.numeric

BUILDERS = [tiny_mixtral, tiny_olmoe, tiny_qwen2_moe, tiny_qwen3_moe]
IDS = ["mixtral", "olmoe", "qwen2_moe", "qwen3_moe"]
EXPERT_SPACES = {"experts": "permutation", "expert_units": "permutation", "expert_scale": "diagonal"}
# the shared expert's units and scales (Qwen2-MoE) and the attention's spaces, where the model has them
OTHERS = {"heads": "permutation", "qheads": "permutation", "mlp": "permutation", "mlp_scale": "diagonal"}


def planted(build, classes: dict[str, str], seed: int = 0):
    """(A, its spec, the planted transform, B = the transform of A); the planted scales flip some signs."""
    a = to_canonical(build(seed=3))
    spec = SymmetrySpec.from_model(a)
    transform = Transform.sample(spec, classes, torch.Generator().manual_seed(seed))
    scales = torch.stack([g.scales for n, g in transform.items() if n.startswith("expert_scale.")])
    assert (scales < 0).any() and (scales.abs() - 1).abs().max() > 0.5
    return a, spec, transform, apply(transform, a)


def relative_distance(a, b) -> float:
    """||theta_B - theta_A|| / ||theta_A|| over every parameter."""
    pa, pb = a.params(), b.params()
    num = sum(float((pb[k].detach().double() - v.detach().double()).pow(2).sum()) for k, v in pa.items())
    return (num / sum(float(v.detach().double().pow(2).sum()) for v in pa.values())) ** 0.5


@pytest.mark.parametrize("build", BUILDERS, ids=IDS)
def test_the_spec_scales_each_experts_units_after_their_order(build):
    model = to_canonical(build())
    spec = SymmetrySpec.from_model(model)
    scale, units = spec["expert_scale.0"], spec["expert_units.0"]
    assert (scale.size, scale.heads, scale.classes) == (units.size, units.heads, ("diagonal",))
    assert {(ax.param, ax.axis, ax.side, ax.head_axis) for ax in scale.acts_on} == {
        ("blocks.0.expert_in_w", 1, "out", 0),
        ("blocks.0.expert_out_w", 2, "in", 0),
    }
    names = list(spec.spaces)
    assert names.index("experts.0") < names.index("expert_units.0") < names.index("expert_scale.0")
    assert "expert_scale" in kept_spaces(model)  # learned matching keeps weight matching's scales


@pytest.mark.parametrize("build", BUILDERS, ids=IDS)
def test_weight_matching_recovers_a_planted_transform_with_unit_scales(build):
    a, spec, transform, b = planted(build, {"residual": "orthogonal", **OTHERS, **EXPERT_SPACES})
    assert relative_distance(a, b) > 0.3
    found, _ = weight_matching(a, b, max_iter=5)
    assert relative_distance(a, apply(found, b)) < 1e-6
    assert {n.partition(".")[0] for n in found} >= set(EXPERT_SPACES)


def test_fixed_experts_still_match_units_and_their_scales():
    a, _, _, b = planted(tiny_mixtral, {"expert_units": "permutation", "expert_scale": "diagonal"}, seed=2)
    found, _ = weight_matching(a, b, max_iter=2, options={"experts": "fixed"})
    assert relative_distance(a, apply(found, b)) < 1e-6


@pytest.mark.parametrize("build", BUILDERS, ids=IDS)
def test_activation_matching_recovers_the_experts_units_and_scales(build, tmp_path):
    a, _, _, b = planted(build, {"heads": "permutation", **EXPERT_SPACES}, seed=1)
    data = next_token_data(min(61, a.params()["embed.tokens"].shape[0]))
    alignment = ActivationMatcher(batches=2).match(a, b, MatchContext(data=data, run_dir=tmp_path))
    assert {n.partition(".")[0] for n in alignment.transform} >= set(EXPERT_SPACES)
    aligned, pa = alignment.model.params(), a.params()
    for l in range(a.num_layers):
        for name in ("router_w", "expert_gate_w", "expert_in_w", "expert_out_w"):
            x, y = aligned[f"blocks.{l}.{name}"].detach(), pa[f"blocks.{l}.{name}"].detach()
            assert float((x - y).norm() / y.norm()) < 1e-6, name


@pytest.mark.parametrize("build", BUILDERS, ids=IDS)
def test_the_audit_finds_no_hole_in_the_experts(build):
    audit = glmc.symmetries(build())
    assert not audit.holes and not audit.bugs, str(audit)
    used = {f.what: f.status for f in (*audit.generators, *audit.candidates)}
    assert used["expert_scale: diagonal"] == used["expert up/down scales"] == "symmetry used"
