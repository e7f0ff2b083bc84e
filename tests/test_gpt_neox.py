"""GPT-NeoX (Pythia: LayerNorms folded, fused per-head query_key_value, partial rotary, parallel or sequential
residual): exact conversion, every symmetry its spec claims, which query/key maps survive when only some
of a head's dims rotate, matchers that keep B, an export reloaded with from_pretrained, and run.py on two
folders.

Partial rotary rotates the first r of a head's d dims. The qk group is then a rotation-scaling per rotary
pair together with any invertible map of the d - r pass-through dims (keys: the inverse transpose); a map
mixing the two kinds of dims, or a general invertible map of the whole head, changes the logits."""

import dataclasses
import math

import pytest
import torch
from transformers import GPTNeoXForCausalLM

from glmc.interpolation import interpolate
from glmc.matching.weight import weight_matching
from glmc.models import to_canonical
from glmc.models.canonical import CanonicalTransformer
from glmc.models.export import export_hf, to_hf
from glmc.symmetry import Invertible, RotaryScale, SymmetrySpec, Transform, apply
from glmc.symmetry.groups import random_orthogonal

from family_checks import (
    MATCHERS,
    assert_alignment_keeps_b,
    assert_symmetry_keeps_function,
    claimed,
    cli_on_two_folders,
    next_token_data,
)
from numeric import FORWARD, assert_close_rel, assert_params_close_rel, relative_error
from tiny_hf import inputs_for, tiny_gpt_neox

pytestmark = pytest.mark.numeric

# two heads of 16 dims: rotary on 4, 16 or 8 of them
LAYOUTS = {
    "parallel, rotary 1/4": dict(parallel=True, rotary_pct=0.25),
    "parallel, full rotary": dict(parallel=True, rotary_pct=1.0),
    "sequential, rotary 1/2": dict(parallel=False, rotary_pct=0.5),
    "sequential, full rotary": dict(parallel=False, rotary_pct=1.0),
}
HEAD_DIM = 16


@pytest.fixture(scope="module", params=list(LAYOUTS))
def neox(request):
    hf = tiny_gpt_neox(**LAYOUTS[request.param])
    return request.param, hf, to_canonical(hf), inputs_for(hf)


def logit_change(model: CanonicalTransformer, other: CanonicalTransformer, x) -> float:
    with torch.no_grad():
        return relative_error(other(x), model(x))[0]


def test_conversion_matches_hf(neox):
    name, hf, model, x = neox
    layout = LAYOUTS[name]
    rotary = int(HEAD_DIM * layout["rotary_pct"])
    assert model.config.parallel_residual == layout["parallel"]
    assert model.config.rotary_dims == (None if rotary == HEAD_DIM else rotary)
    assert model.task == "causal_lm" and model.config.rope_theta == 100.0
    with torch.no_grad():
        assert_close_rel(model(x), hf(x).logits, FORWARD, f"{name}: canonical vs HF logits")


def test_the_residual_form_and_the_rotary_dims_matter(neox):
    """The same tensors with the other residual form, or with every dim rotating, compute something else."""
    name, _, model, x = neox
    c = model.config
    other = CanonicalTransformer(dataclasses.replace(c, parallel_residual=not c.parallel_residual), model.params())
    assert logit_change(model, other, x) > 1e-2, f"{name}: the residual form made no difference"
    if c.rotary_dims is not None:
        every = CanonicalTransformer(dataclasses.replace(c, rotary_dims=None), model.params())
        assert logit_change(model, every, x) > 1e-2, f"{name}: rotating every dim made no difference"


CASES = {
    "residual orthogonal": {"residual": "orthogonal"},
    "residual permutation": {"residual": "permutation"},
    "heads permutation": {"heads": "permutation"},
    "heads semi-permutation (+2)": {"heads": "semi_permutation"},
    "qk rotary rotation-scaling, pass-through dims invertible": {"qk": "rotary_scale"},
    "vo invertible": {"vo": "invertible"},
    "vo orthogonal_scale": {"vo": "orthogonal_scale"},
    "mlp permutation": {"mlp": "permutation"},
    "all at once": dict(
        residual="orthogonal", heads="permutation", qk="rotary_scale", vo="invertible", mlp="permutation"
    ),
}


def test_the_cases_are_what_the_spec_claims(neox):
    """Every class the spec offers has a case; a head has its own keys, so no query heads space is built."""
    _, _, model, _ = neox
    cases = {(kind, cls) for classes in CASES.values() for kind, cls in classes.items()}
    assert claimed(model) == cases
    assert not SymmetrySpec.from_model(model).names("qheads")


@pytest.mark.parametrize("case", list(CASES))
def test_symmetry_preserves_function(neox, case):
    name, _, model, x = neox
    assert_symmetry_keeps_function(model, x, CASES[case], f"{name} {case}")


def qk_maps(model: CanonicalTransformer, head_map) -> Transform:
    """An Invertible element on every qk space, each head's map `head_map(d, generator)` (d, d)."""
    g = torch.Generator().manual_seed(7)
    spec = SymmetrySpec.from_model(model)
    return Transform(
        {
            s: Invertible(torch.stack([head_map(spec[s].size, g) for _ in range(spec[s].heads)]))
            for s in spec.names("qk")
        }
    )


def plane_rotation(d: int, i: int, j: int, angle: float = 1.0) -> torch.Tensor:
    m = torch.eye(d)
    c, s = math.cos(angle), math.sin(angle)
    m[i, i], m[i, j], m[j, i], m[j, j] = c, -s, s, c
    return m


@pytest.fixture(scope="module", params=[name for name, layout in LAYOUTS.items() if layout["rotary_pct"] < 1])
def partial(request):
    """A partial-rotary layout: (name, model, inputs, rotary dims per head)."""
    hf = tiny_gpt_neox(**LAYOUTS[request.param])
    model = to_canonical(hf)
    return request.param, model, inputs_for(hf), model.config.rotary_dims


def test_the_sampled_qk_element_is_a_general_map_of_the_pass_through_dims(partial):
    name, model, _, r = partial
    spec = SymmetrySpec.from_model(model)
    assert spec["qk.0"].rotary_dims == r and spec["qk.0"].size == HEAD_DIM
    g = Transform.sample(spec, {"qk": "rotary_scale"}, torch.Generator().manual_seed(0))["qk.0"]
    assert g.rotary_dims == r and g.passthrough.shape == (2, HEAD_DIM - r, HEAD_DIM - r)
    gram = g.passthrough.transpose(1, 2) @ g.passthrough
    assert not torch.allclose(gram, torch.eye(HEAD_DIM - r).expand_as(gram), atol=1e-2), "an orthogonal block only"


def test_pass_through_dims_admit_any_invertible_map(partial):
    """block_diag(I_r, M) with M a random invertible map, as a plain invertible element: the logits stay."""
    name, model, x, r = partial
    block = lambda d, g: torch.block_diag(torch.eye(r), Invertible.sample(1, d - r, g).matrices[0])  # noqa: E731
    with torch.no_grad():
        assert_close_rel(apply(qk_maps(model, block), model, strict=False)(x), model(x), FORWARD, name)


@pytest.mark.parametrize("plane", ["rotary with pass-through", "two pass-through dims"])
def test_maps_mixing_rotary_and_pass_through_dims_change_the_logits(partial, plane):
    """The same rotation, in the plane of the first rotary dim and the first pass-through dim, changes the
    logits; in the plane of two pass-through dims it does not."""
    name, model, x, r = partial
    i, j = (0, r) if plane == "rotary with pass-through" else (r, r + 1)
    changed = logit_change(model, apply(qk_maps(model, lambda d, g: plane_rotation(d, i, j)), model, strict=False), x)
    if plane == "rotary with pass-through":
        assert changed > 1e-2, f"{name}: mixing rotary and pass-through dims kept the logits ({changed:.1e})"
    else:
        assert changed < FORWARD, f"{name}: a rotation of pass-through dims changed the logits ({changed:.1e})"


def test_general_and_full_head_rotary_maps_break_partial_rotary(partial):
    """A general invertible map of the whole head, and a rotation-scaling pairing the whole head's dims as
    if every dim rotated, are refused as symmetries and change the logits."""
    name, model, x, r = partial
    spec = SymmetrySpec.from_model(model)
    g = torch.Generator().manual_seed(1)
    general = Transform({"qk.0": Invertible.sample(2, HEAD_DIM, g)})
    full_head = Transform({"qk.0": RotaryScale.sample(2, HEAD_DIM, g)})
    assert spec["qk.0"].classes == ("rotary_scale",)
    with pytest.raises(ValueError, match="invertible is not a symmetry of qk.0"):
        apply(general, model)
    with pytest.raises(ValueError, match=f"rotating {HEAD_DIM} dims is not a symmetry of qk.0.*first {r}"):
        apply(full_head, model)
    for what, t in (("general invertible", general), ("whole-head rotary_scale", full_head)):
        changed = logit_change(model, apply(t, model, strict=False), x)
        assert changed > 1e-2, f"{name}: a {what} qk map kept the logits ({changed:.1e})"


def test_stacked_heads_rotate_block_by_block(neox):
    """Circuit interpolation stacks the models' heads; a model interpolated with itself stacks each head
    twice, and computes the model's function only if every block rotates its own first r dims."""
    name, _, model, x = neox
    stacked = interpolate([model, model], [0.5, 0.5], circuits=("qk", "vo"))
    assert stacked.params()["blocks.0.q_w"].shape[2] == 2 * HEAD_DIM
    with torch.no_grad():
        assert_close_rel(stacked(x), model(x), FORWARD, f"{name}: stacked heads vs the model")


def test_no_circuit_form(neox):
    with pytest.raises(ValueError, match="no circuit form"):
        neox[2].to_circuit()


def test_export_round_trip(neox, tmp_path):
    name, hf, model, x = neox
    loaded = GPTNeoXForCausalLM.from_pretrained(export_hf(model, hf, tmp_path / "out")).eval()
    assert loaded.config.use_parallel_residual == hf.config.use_parallel_residual
    with torch.no_grad():
        assert_close_rel(loaded(x).logits, hf(x).logits, FORWARD, f"{name}: exported vs original logits")


def test_a_transformed_model_exports_to_the_same_function():
    hf = tiny_gpt_neox()
    model, x = to_canonical(hf), inputs_for(hf)
    classes = dict(residual="permutation", heads="permutation", qk="rotary_scale", vo="invertible", mlp="permutation")
    moved = apply(Transform.sample(SymmetrySpec.from_model(model), classes, torch.Generator().manual_seed(2)), model)
    with torch.no_grad():
        assert_close_rel(to_hf(moved, hf)(x).logits, hf(x).logits, FORWARD, "transformed and exported vs original")


@pytest.mark.parametrize(
    "other,message",
    [
        (dict(parallel=False), "parallel residual False is not the model's True"),
        (dict(rotary_pct=0.5), "rotary dims per head 8 is not the model's 4"),
        (dict(rope={"rope_type": "linear", "factor": 2.0}), "rotary scaling"),
        (dict(act="relu"), "activation"),
    ],
)
def test_export_refuses_a_template_of_another_layout(other, message):
    model = to_canonical(tiny_gpt_neox(layers=1))
    with pytest.raises(ValueError, match=message):
        to_hf(model, tiny_gpt_neox(layers=1, **other))


# ---------------------------------------------------------------- matching


@pytest.fixture(scope="module")
def pair():
    return tiny_gpt_neox(seed=0), tiny_gpt_neox(seed=1), next_token_data(53)


@pytest.mark.parametrize("method", list(MATCHERS))
def test_alignment_keeps_b(pair, method, tmp_path):
    hf_a, hf_b, data = pair
    assert_alignment_keeps_b(hf_a, hf_b, method, data, tmp_path)


def test_weight_matching_recovers_hidden_rotary_and_pass_through_maps():
    """B is A under permutations of the stream, heads and units and, per head, rotation-scalings of the
    rotary pairs with a random rotation of the 12 pass-through dims: weight matching solves the pairs and
    the pass-through block (orthogonal Procrustes) and recovers A."""
    a = to_canonical(tiny_gpt_neox())
    spec = SymmetrySpec.from_model(a)
    g = torch.Generator().manual_seed(3)
    classes = dict(residual="permutation", heads="permutation", mlp="permutation", qk="rotary_scale")
    hidden = Transform.sample(spec, classes, g)
    for name in spec.names("qk"):
        hidden[name] = dataclasses.replace(hidden[name], passthrough=random_orthogonal(12, 12, g, (2,)))
    b = apply(hidden, a)
    transform, _ = weight_matching(a, b, max_iter=3)
    assert transform["qk.0"].passthrough.shape == (2, 12, 12)
    assert_params_close_rel(apply(transform, b).params(), a.params(), FORWARD, "weight matching: recovered A")


def test_run_py_on_two_folders(monkeypatch, capsys, tmp_path):
    results = cli_on_two_folders(monkeypatch, capsys, tmp_path, "gpt_neox", rotary_pct=0.5)
    assert results["model"].startswith("gpt_neox (")
