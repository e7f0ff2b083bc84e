"""Post-norm encoders (BERT, RoBERTa): exact conversion and export, and which maps are symmetries.

The residual stream of a post-norm model is a LayerNorm's output: a permutation commutes with the mean
subtraction and the elementwise gain, an orthogonal map does not."""

import pytest
import torch

from glmc.models import relative_deviation, to_canonical
from glmc.models.export import export_hf, to_hf
from glmc.symmetry import Orthogonal, SymmetrySpec, Transform, apply

from numeric import FORWARD, assert_close_rel
from tiny_hf import inputs_for, tiny_encoder

pytestmark = pytest.mark.numeric
LAYOUTS = [(f, h) for f in ("bert", "roberta") for h in ("mlm", "classification")]


@pytest.fixture(scope="module", params=LAYOUTS, ids=[f"{f}-{h}" for f, h in LAYOUTS])
def encoder(request):
    family, head = request.param
    hf = tiny_encoder(family, head)
    x = inputs_for(hf)
    x[0, -3:] = 0  # padding ids: RoBERTa's positions skip them
    return f"{family}-{head}", hf, to_canonical(hf), x


@pytest.mark.parametrize("form", ["factored", "circuit"])
def test_conversion_matches_hf(encoder, form):
    name, hf, model, x = encoder
    model = model if form == "factored" else model.to_circuit()
    with torch.no_grad():
        assert_close_rel(model(x), hf(x).logits, FORWARD, f"{name} {form}: canonical vs HF logits")
    assert model.task == ("classification" if name.endswith("classification") else "masked_lm")


def test_export_round_trip(encoder, tmp_path):
    name, hf, model, x = encoder
    folder = export_hf(model, hf, tmp_path / "out")
    loaded = type(hf).from_pretrained(folder).eval()
    with torch.no_grad():
        assert_close_rel(loaded(x).logits, hf(x).logits, FORWARD, f"{name}: exported vs original logits")


def sample(model, classes, seed=0, grow=0):
    return Transform.sample(SymmetrySpec.from_model(model), classes, torch.Generator().manual_seed(seed), grow=grow)


CASES = {
    "residual permutation": ({"residual": "permutation"}, 0),
    "heads permutation": ({"heads": "permutation"}, 0),
    "heads semi-permutation (H+2)": ({"heads": "semi_permutation"}, 2),
    "qk invertible": ({"qk": "invertible"}, 0),
    "vo invertible": ({"vo": "invertible"}, 0),
    "qk orthogonal_scale": ({"qk": "orthogonal_scale"}, 0),
    "vo orthogonal_scale": ({"vo": "orthogonal_scale"}, 0),
    "mlp permutation": ({"mlp": "permutation"}, 0),
    "head_hidden permutation": ({"head_hidden": "permutation"}, 0),
    "all at once": (
        dict(
            residual="permutation",
            heads="permutation",
            qk="invertible",
            vo="invertible",
            mlp="permutation",
            head_hidden="permutation",
        ),
        0,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_symmetry_preserves_function(encoder, case):
    name, _, model, x = encoder
    classes, grow = CASES[case]
    new = apply(sample(model, classes, grow=grow), model)
    with torch.no_grad():
        assert_close_rel(new(x), model(x), FORWARD, f"{name} {case}: logits")


def test_circuit_form_residual_and_head_permutation(encoder):
    name, _, model, x = encoder
    circuit = model.to_circuit()
    new = apply(sample(circuit, {"residual": "permutation", "heads": "permutation"}), circuit)
    with torch.no_grad():
        assert_close_rel(new(x), model(x), FORWARD, f"{name} circuit residual and heads permutation")


def test_orthogonal_residual_is_refused_and_changes_the_function(encoder):
    name, _, model, x = encoder
    spec = SymmetrySpec.from_model(model)
    assert spec.classes_for("residual") == ("permutation",)
    rotation = Transform(residual=Orthogonal.sample(model.width, torch.Generator().manual_seed(0)))
    with pytest.raises(ValueError, match="not a symmetry"):
        apply(rotation, model)
    with torch.no_grad():
        dev = relative_deviation(apply(rotation, model, strict=False)(x), model(x))
    print(f"\n  {name} orthogonal residual map (should change): {dev:.2e}")
    assert dev > 1e-2


def test_spec_places_the_layernorms_on_the_residual(encoder):
    _, _, model, _ = encoder
    listed = {a.param for a in SymmetrySpec.from_model(model)["residual"].acts_on}
    suffixes = ("ln1_w", "ln1_b", "ln2_w", "ln2_b", "embed.norm_w", "embed.norm_b")
    norms = {k for k in model.params() if k.endswith(suffixes)}
    assert len(norms) == 2 * 4 + 2 and norms <= listed
    assert "head.dense_w" in listed and "head.w" not in listed  # the head's output map reads its own space


def test_masked_lm_and_classifier_templates_do_not_mix(encoder):
    name, hf, model, _ = encoder
    other = tiny_encoder(name.split("-")[0], "classification" if name.endswith("mlm") else "mlm")
    with pytest.raises(ValueError, match="cannot be written"):
        to_hf(model, other)


def test_fine_tuning_starts_from_the_pretrained_encoder():
    from glmc.train.warm_start import load_encoder

    for family in ("bert", "roberta"):
        pretrained, fresh = tiny_encoder(family, "mlm", seed=0), tiny_encoder(family, "classification", seed=1)
        load_encoder(fresh, pretrained)
        own = pretrained.base_model.state_dict()
        for name, tensor in fresh.base_model.state_dict().items():
            assert name.startswith("pooler.") or torch.equal(tensor, own[name]), f"{family}: {name}"
        with pytest.raises(ValueError, match="shape"):
            load_encoder(tiny_encoder(family, "classification", hidden=16), pretrained)
