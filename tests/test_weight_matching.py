"""Weight matching recovers hidden symmetries, keeps B's function, and its head cost is exact."""

from __future__ import annotations

import pytest
import torch

from glmc.matching.engine.circuits import circuit_cost, relative_distance
from glmc.matching.engine.residual_map import ones_complement
from glmc.matching.registry import build_matcher, default_method_config
from glmc.matching.weight import WeightMatcher, weight_matching
from glmc.models import to_canonical
from glmc.models.canonical import canonical_forward
from glmc.models.export import export_hf, uncentred_writer
from glmc.symmetry import Orthogonal, SymmetrySpec, Transform, apply

from families import FAMILIES
from numeric import FEW_OPS, FORWARD, assert_close_rel
from tiny_hf import inputs_for, tiny_vit

pytestmark = pytest.mark.numeric


def _double(model):
    return {k: v.detach().double() for k, v in model.params().items()}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("residual", ["orthogonal", "permutation"])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.float64, 1e-6)])
def test_recovers_a_hidden_symmetry(family, residual, dtype, tol):
    a = to_canonical(FAMILIES[family](seed=0))
    spec = SymmetrySpec.from_model(a)
    hidden = Transform.sample(
        spec, {"residual": residual, "heads": "permutation", "mlp": "permutation"}, torch.Generator().manual_seed(3)
    )
    b = apply(hidden, a)
    assert relative_distance(_double(a), _double(b)) > 0.5  # far apart before matching
    transform, diag = weight_matching(a, b, residual, dtype=dtype)
    aligned = apply(transform, b)
    assert diag["objective"][0] > 0.5 and diag["final_distance"] < tol
    assert relative_distance(_double(a), _double(aligned)) < tol
    objective = diag["objective"]
    assert min(objective) == diag["final_distance"] and len(objective) == diag["iterations"] + 1


@pytest.mark.parametrize("family", FAMILIES)
def test_aligned_model_computes_b(family):
    a, b = to_canonical(FAMILIES[family](seed=0)), FAMILIES[family](seed=1)
    alignment = WeightMatcher().match(a, to_canonical(b))
    x = inputs_for(b)
    deviation = assert_close_rel(alignment.model(x), b(x).logits, FORWARD, f"{family}: weight-matched B vs B logits")
    print(f"\n{family}: weight-matched B vs B, relative logit deviation {deviation:.2e}")
    # factored models whose attention the path interpolates as circuits
    assert alignment.model.config.form == "factored" and alignment.circuits == ("qk", "vo")
    mid = alignment.interpolate(0.5)
    explicit = {k: 0.5 * v + 0.5 * alignment.model.to_circuit().params()[k] for k, v in a.to_circuit().params().items()}
    assert_close_rel(mid(x), canonical_forward(a.to_circuit().config, explicit, x), FORWARD, "midpoint vs circuits")
    # Matching two independent models brings them closer than the unaligned canonical forms.
    objective = alignment.diagnostics["objective"]
    assert objective[-1] < objective[0]


def test_head_cost_equals_explicit_circuit_distances():
    a, b = to_canonical(tiny_vit(seed=0)), to_canonical(tiny_vit(seed=1))
    cost = circuit_cost(_double(a), _double(b), 0)
    ca, cb = a.to_circuit().params(), b.to_circuit().params()
    qa, qb = ca["blocks.0.qk"].double(), cb["blocks.0.qk"].double()
    oa, ob = ca["blocks.0.ov"].double(), cb["blocks.0.ov"].double()
    explicit = torch.cdist(qa.flatten(1), qb.flatten(1)) + torch.cdist(oa.flatten(1), ob.flatten(1))
    assert_close_rel(cost, explicit, FEW_OPS, "head cost vs circuit distances")


def test_permutation_only_cannot_undo_a_rotation():
    a = to_canonical(tiny_vit(seed=0))
    hidden = Transform.sample(SymmetrySpec.from_model(a), {"residual": "orthogonal"}, torch.Generator().manual_seed(0))
    b = apply(hidden, a)
    _, perm_only = weight_matching(a, b, "permutation")
    _, orthogonal = weight_matching(a, b, "orthogonal")
    assert orthogonal["final_distance"] < 1e-5 < 0.1 < perm_only["final_distance"]


def _fixes_ones(transform) -> bool:
    o = transform["residual"].matrix.double()
    ones = torch.ones(o.shape[0], dtype=torch.float64)
    return bool((o @ ones - ones).abs().max() < 1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_keep_mean_fixes_ones_and_keeps_b(family):
    a, b = to_canonical(FAMILIES[family](seed=0)), FAMILIES[family](seed=1)
    assert uncentred_writer(a) is None and uncentred_writer(to_canonical(b)) is None
    transform, _ = weight_matching(a, to_canonical(b), keep_mean=True)
    assert _fixes_ones(transform)
    unrestricted, _ = weight_matching(a, to_canonical(b))
    assert not _fixes_ones(unrestricted)  # plain Procrustes moves 1
    alignment = WeightMatcher(keep_mean="always").match(a, to_canonical(b))
    assert alignment.diagnostics["keep_mean"] and _fixes_ones(alignment.transform)
    assert uncentred_writer(alignment.model) is None
    x = inputs_for(b)
    assert_close_rel(alignment.model(x), b(x).logits, FORWARD, f"{family}: keep_mean aligned B vs B logits")
    # "auto" restricts for centred streams, "never" does not
    assert WeightMatcher(max_iter=1, keep_mean="auto").match(a, to_canonical(b)).diagnostics["keep_mean"]
    assert not WeightMatcher(max_iter=1, keep_mean="never").match(a, to_canonical(b)).diagnostics["keep_mean"]


def test_keep_mean_merge_exports_to_hf(tmp_path):
    a, b = to_canonical(tiny_vit(seed=0)), to_canonical(tiny_vit(seed=1))
    alignment = WeightMatcher(qk="none", vo="none", keep_mean="auto").match(a, b)
    assert alignment.circuits == ()
    mid = alignment.interpolate(0.5)
    folder = export_hf(mid, a.source, tmp_path / "hf")
    hf = type(a.source).from_pretrained(folder, attn_implementation="eager").eval()
    x = inputs_for(a.source)
    with torch.no_grad():
        assert_close_rel(hf(x).logits, mid(x), FORWARD, "exported midpoint vs canonical logits")


@pytest.mark.parametrize("family", FAMILIES)
def test_keep_mean_recovers_a_symmetry_that_fixes_ones(family):
    a = to_canonical(FAMILIES[family](seed=0))
    spec = SymmetrySpec.from_model(a)
    g = torch.Generator().manual_seed(3)
    hidden = Transform.sample(spec, {"heads": "permutation", "mlp": "permutation"}, g)
    q, width = ones_complement(a.width), a.width
    rotation = Orthogonal.sample(width - 1, g, dtype=torch.float64).matrix
    hidden["residual"] = Orthogonal((q @ rotation @ q.T + 1.0 / width).float())
    b = apply(hidden, a)
    assert uncentred_writer(b) is None
    assert relative_distance(_double(a), _double(b)) > 0.5
    transform, diag = weight_matching(a, b, keep_mean=True)
    assert _fixes_ones(transform)
    assert diag["final_distance"] < 1e-4
    assert relative_distance(_double(a), _double(apply(transform, b))) < 1e-4


def test_keep_mean_settings_are_checked():
    with pytest.raises(ValueError, match=r"matcher\.weight\.keep_mean"):
        WeightMatcher(keep_mean="yes")
    with pytest.raises(ValueError, match=r"matcher\.weight\.keep_mean"):
        build_matcher(default_method_config("weight", keep_mean="sometimes"))
    # weight_perm shares the setting; permutations fix 1 without it
    perm = build_matcher(default_method_config("weight_perm"))
    assert perm.keep_mean == "never" and perm.residual == "permutation"
    # a rotated (not mean-zero) model: "always" refuses, "auto" falls back to the full group
    a = to_canonical(tiny_vit(seed=0))
    rotated = apply(Transform({"residual": Orthogonal.sample(a.width, torch.Generator().manual_seed(0))}), a)
    assert uncentred_writer(rotated) is not None
    with pytest.raises(ValueError, match=r"matcher\.weight\.keep_mean=always.*embed\.patch_w"):
        WeightMatcher(keep_mean="always").match(a, rotated)
    alignment = WeightMatcher(max_iter=2, keep_mean="auto").match(a, rotated)
    assert not alignment.diagnostics["keep_mean"]
