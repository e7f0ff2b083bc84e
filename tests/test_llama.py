"""Llama-style models (RMSNorm, rotary positions, grouped-query attention, SwiGLU): exact conversion and
export, and a function-preservation test for every symmetry the family claims.

Group sizes 1, 2 and 4 are 4 query heads over 4, 2 and 1 key/value heads."""

import pytest
import torch

from glmc.models import to_canonical
from glmc.models.export import export_hf
from glmc.symmetry import SymmetrySpec, Transform, apply

from numeric import FORWARD, assert_close_rel, relative_error
from tiny_hf import inputs_for, tiny_llama

pytestmark = pytest.mark.numeric

LAYOUTS = {
    "group1": dict(kv_heads=4),
    "group2": dict(kv_heads=2),
    "group4": dict(kv_heads=1),
    "tied": dict(tied=True),
    "biases": dict(bias=True),
    "qwen2": dict(kind="qwen2"),
}


@pytest.fixture(scope="module", params=list(LAYOUTS))
def llama(request):
    hf = tiny_llama(**LAYOUTS[request.param])
    return request.param, hf, to_canonical(hf), inputs_for(hf)


def test_conversion_matches_hf(llama):
    name, hf, model, x = llama
    with torch.no_grad():
        assert_close_rel(model(x), hf(x).logits, FORWARD, f"{name}: canonical vs HF logits")
    assert model.task == "causal_lm"
    assert model.config.rope_theta == 100.0


def test_export_round_trip(llama, tmp_path):
    name, hf, model, x = llama
    folder = export_hf(model, hf, tmp_path / "out")
    loaded = type(hf).from_pretrained(folder).eval()
    with torch.no_grad():
        assert_close_rel(loaded(x).logits, hf(x).logits, FORWARD, f"{name}: exported vs original logits")


def sample(model, classes, seed=0, grow=0):
    return Transform.sample(SymmetrySpec.from_model(model), classes, torch.Generator().manual_seed(seed), grow=grow)


CASES = {
    "residual orthogonal": ({"residual": "orthogonal"}, 0),
    "residual permutation": ({"residual": "permutation"}, 0),
    "key/value groups permutation": ({"heads": "permutation"}, 0),
    "key/value groups semi-permutation (+2)": ({"heads": "semi_permutation"}, 2),
    "query heads within groups": ({"qheads": "permutation"}, 0),
    "qk rotary rotation-scaling": ({"qk": "rotary_scale"}, 0),
    "vo invertible per group": ({"vo": "invertible"}, 0),
    "vo orthogonal_scale per group": ({"vo": "orthogonal_scale"}, 0),
    "mlp permutation": ({"mlp": "permutation"}, 0),
    "mlp up/down scaling": ({"mlp_scale": "diagonal"}, 0),
    "all at once": (
        dict(
            residual="orthogonal",
            heads="permutation",
            qheads="permutation",
            qk="rotary_scale",
            vo="invertible",
            mlp="permutation",
            mlp_scale="diagonal",
        ),
        0,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_symmetry_preserves_function(llama, case):
    name, _, model, x = llama
    classes, grow = CASES[case]
    transform = sample(model, classes, grow=grow)
    if not transform and name == "group1":  # one query head per group: no qheads space to permute
        assert set(classes) == {"qheads"} and not SymmetrySpec.from_model(model).names("qheads")
        return
    assert transform, f"{name}: no space takes {classes}"
    new = apply(transform, model)
    spec = SymmetrySpec.from_model(model)
    if any(spec[space].size > 1 for space in transform):  # one key/value group: nothing to permute
        assert any(not torch.equal(new.params()[k], v) for k, v in model.params().items()), "nothing moved"
    with torch.no_grad():
        assert_close_rel(new(x), model(x), FORWARD, f"{name} {case}: logits")


@pytest.mark.parametrize("qk", ["invertible", "orthogonal_scale"])
def test_general_qk_maps_break_rotary_attention(llama, qk):
    """Only maps that commute with every position's rotation survive: a general invertible map (or an
    orthogonal one mixing frequency pairs) of the query space, with its inverse transpose on the keys,
    keeps W_q^T W_k but changes the logits."""
    name, _, model, x = llama
    spec = SymmetrySpec.from_model(model)
    assert spec["qk.0"].classes == ("rotary_scale",)
    with pytest.raises(ValueError, match="not a symmetry of qk.0"):
        apply(sample(model, {"qk": qk}), model)
    broken = apply(sample(model, {"qk": qk}), model, strict=False)
    with torch.no_grad():
        error, _ = relative_error(broken(x), model(x))
    assert error > 1e-2, f"{name}: a {qk} qk map kept the logits (relative change {error:.1e})"


def test_gate_is_not_linear(llama):
    """The per-unit scaling holds for the linear (up) branch only: scaling the gate against down breaks it."""
    name, _, model, x = llama
    params = model.params()
    scale = torch.linspace(0.5, 2.0, params["blocks.0.gate_w"].shape[0])
    changed = dict(params)
    changed["blocks.0.gate_w"] = params["blocks.0.gate_w"] * scale[:, None]
    changed["blocks.0.gate_b"] = params["blocks.0.gate_b"] * scale
    changed["blocks.0.out_w"] = params["blocks.0.out_w"] / scale
    with torch.no_grad():
        error, _ = relative_error(type(model)(model.config, changed)(x), model(x))
    assert error > 1e-3, f"{name}: scaling the gate kept the logits"


def test_no_circuit_form(llama):
    with pytest.raises(ValueError, match="no circuit form"):
        llama[2].to_circuit()


def test_sliding_window_converts():
    """A window of 3 over 11 tokens: the canonical model applies it as Mistral does (more cases:
    tests/test_sliding_window.py)."""
    hf = tiny_llama(kind="mistral", window=3, layers=1, hidden=16)
    x = inputs_for(hf)
    model = to_canonical(hf)
    assert (model.config.sliding_window, model.config.sliding_layers) == (3, None)
    with torch.no_grad():
        assert_close_rel(model(x), hf(x).logits, FORWARD, "mistral with a window: canonical vs HF logits")


def test_mistral_without_window_converts():
    hf = tiny_llama(kind="mistral", window=None, layers=1, hidden=16)
    x = inputs_for(hf)
    model = to_canonical(hf)
    assert model.config.sliding_window is None
    with torch.no_grad():
        assert_close_rel(model(x), hf(x).logits, FORWARD, "mistral: canonical vs HF logits")
