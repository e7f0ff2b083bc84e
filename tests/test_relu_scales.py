"""Plain ReLU MLPs (OPT): each unit's positive scale (in row and bias times a, out column over a) is
declared (mlp_scale, positive_diagonal), recovered by weight and activation matching from a planted
scaled permutation, and the audit finds no hole."""

import json
import sys

import pytest
import torch

import glmc
from glmc.matching.activation import ActivationMatcher
from glmc.matching.base import MatchContext
from glmc.matching.weight import weight_matching
from glmc.models import to_canonical
from glmc.models.canonical import canonical_forward
from glmc.symmetry import PositiveDiagonal, SymmetrySpec, Transform, apply

from conftest import load_script
from family_checks import next_token_data
from numeric import FORWARD, assert_close_rel, relative_error
from tiny_hf import tiny_gpt2, tiny_opt

pytestmark = pytest.mark.numeric

PLANTED = {"residual": "permutation", "heads": "permutation", "mlp": "permutation", "mlp_scale": "positive_diagonal"}


def flat(model) -> torch.Tensor:
    return torch.cat([t.flatten() for t in model.params().values()])


@pytest.fixture(scope="module")
def planted():
    """Tiny OPT A (float64) and B: A with its stream, heads and units permuted and each unit scaled by a
    random positive factor."""
    a = to_canonical(tiny_opt()).double()
    g = torch.Generator().manual_seed(3)
    sample = Transform.sample(SymmetrySpec.from_model(a), PLANTED, g, dtype=torch.float64)
    scales = sample["mlp_scale.0"].scales
    assert float(scales.max() / scales.min()) > 2  # the scales are far from one another
    return a, apply(sample, a)


def test_spec_declares_positive_unit_scales_only_for_relu_like_plain_mlps():
    relu = SymmetrySpec.from_model(to_canonical(tiny_opt()))
    assert relu["mlp_scale.0"].classes == ("positive_diagonal",)
    assert {(ax.param, ax.axis, ax.side) for ax in relu["mlp_scale.1"].acts_on} == {
        ("blocks.1.in_w", 0, "out"),
        ("blocks.1.in_b", 0, "out"),
        ("blocks.1.out_w", 1, "in"),
    }
    gelu = SymmetrySpec.from_model(to_canonical(tiny_gpt2()))  # not positively homogeneous: no such space
    assert not gelu.names("mlp_scale")


def test_weight_matching_recovers_a_planted_scaled_permutation(planted):
    a, b = planted
    assert relative_error(flat(b), flat(a))[0] > 0.5
    transform, _ = weight_matching(a, b, dtype=torch.float64)
    assert isinstance(transform["mlp_scale.0"], PositiveDiagonal)
    aligned = apply(transform, b)
    error, _ = relative_error(flat(aligned), flat(a))
    assert error < 1e-6, error
    x = torch.randint(0, 61, (2, 9))
    with torch.no_grad():
        assert_close_rel(aligned(x), b(x), FORWARD, "the aligned model computes B's function")


def test_weight_matching_without_unit_scales_does_not_recover_them(planted):
    """matcher.weight.unit_scales=false: the joined rows' cosine, no scales set (the search before)."""
    a, b = planted
    transform, _ = weight_matching(a, b, dtype=torch.float64, options={"unit_scales": False})
    assert not any(name.startswith("mlp_scale") for name in transform)
    assert relative_error(flat(apply(transform, b)), flat(a))[0] > 1e-2


def live_units(model, data) -> dict[int, torch.Tensor]:
    """Per layer, the units that activate on some token of `data` (a dead unit has no activations to match)."""
    seen: dict[str, torch.Tensor] = {}

    def record(name, t):
        if name.endswith("mlp_act"):
            live = (t.reshape(-1, t.shape[-1]) > 0).any(0)
            seen[name] = seen[name] | live if name in seen else live

    with torch.no_grad():
        for x, _ in data:
            canonical_forward(model.config, model.params(), x, record)
    return {l: seen[f"blocks.{l}.mlp_act"] for l in range(model.num_layers)}


def test_activation_matching_recovers_the_scales(planted):
    a, b = planted
    data = next_token_data(61, seq=12)
    alignment = ActivationMatcher(residual="all", batches=2).match(a, b, MatchContext(data=data))
    assert alignment.function_preserving
    assert all(isinstance(alignment.transform[f"mlp_scale.{l}"], PositiveDiagonal) for l in range(a.num_layers))
    got, want = alignment.model.params(), a.params()
    live = live_units(a, data)
    assert not all(bool(units.all()) for units in live.values())  # a dead unit is left where it may be
    for name, t in want.items():
        g, (layer, _, tensor) = got[name], name.removeprefix("blocks.").partition(".")
        if tensor in ("in_w", "in_b"):  # every live unit's row, its scale included, back in place
            t, g = t[live[int(layer)]], g[live[int(layer)]]
        elif tensor == "out_w":
            t, g = t[:, live[int(layer)]], g[:, live[int(layer)]]
        assert relative_error(g, t)[0] < 1e-6, name


def test_audit_of_opt_finds_no_hole():
    audit = glmc.symmetries(tiny_opt())
    assert audit.ok and not audit.holes, str(audit)
    assert ("mlp_scale", "positive_diagonal") in {(f.space, f.cls) for f in audit.generators}


def test_experiment_script_tabulates_both_runs(tmp_path, monkeypatch, capsys):
    """experiments/relu_unit_scales.py --skip-runs: one row per seed pair and the means, from the runs' results."""

    def write(name, methods):
        pairs = {
            m: {"pairs": [{"seeds": [0, 1], "barrier": x}, {"seeds": [2, 3], "barrier": y}]}
            for m, (x, y) in methods.items()
        }
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps({"methods": pairs}))

    write("with_scales", {"vanilla": (0.8, 0.6), "weight": (0.1, 0.3)})
    write("without_scales", {"weight": (0.2, 0.4)})
    monkeypatch.setattr(sys, "argv", ["relu_unit_scales.py", "--out", str(tmp_path), "--skip-runs"])
    load_script("experiments/relu_unit_scales.py").main()
    lines = capsys.readouterr().out.splitlines()
    assert lines[2:] == [
        "| 0-1 | 0.8000 | 0.2000 | 0.1000 |",
        "| 2-3 | 0.6000 | 0.4000 | 0.3000 |",
        "| mean | 0.7000 | 0.3000 | 0.2000 |",
    ]
