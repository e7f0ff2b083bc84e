"""Signed permutations of the residual stream: each coordinate moved and possibly negated, the class where a
norm with a gain touches the stream (sandwich norms: OLMo-2, Gemma 2, Gemma 3) and a class of its own on
RMS-normalised streams. A planted one (with heads, query heads, MLP units and their scales) is recovered by
weight matching to round-off and not by residual permutations; activation matching reads the signs from
the correlations; learned matching keeps the signs; the export of a flipped model reloads."""

import pytest
import torch

from glmc.matching.activation import ActivationMatcher
from glmc.matching.base import MatchContext
from glmc.matching.weight import weight_matching
from glmc.models import to_canonical
from glmc.models.export import export_hf
from glmc.symmetry import SignedPermutation, SymmetrySpec, Transform, apply

from family_checks import next_token_data
from numeric import FORWARD, assert_close_rel
from tiny_hf import inputs_for, tiny_gemma2, tiny_gemma3, tiny_llama, tiny_olmo2

pytestmark = pytest.mark.numeric

PLANTED = {"heads": "permutation", "qheads": "permutation", "mlp": "permutation", "mlp_scale": "diagonal"}


def test_the_projection_reads_each_sign_off_its_matched_entry():
    g = torch.Generator().manual_seed(0)
    planted = SignedPermutation.sample(12, g)
    # a sign-free part (a gain's outer product) and noise do not move the optimum
    unsigned = torch.rand(12, 12, generator=g) * 0.1
    found = SignedPermutation.project(3 * planted.dense() + 0.1 * torch.randn(12, 12, generator=g), unsigned)
    assert torch.equal(found.perm, planted.perm) and torch.equal(found.signs, planted.signs)
    assert torch.equal(found.inverse().dense(), planted.dense().T)


def _worst(a, b, transform) -> float:
    aligned = apply(transform, b).params()
    return max(float((aligned[k] - v).abs().max() / v.abs().max()) for k, v in a.params().items())


def _planted(build, residual="signed_permutation", seed=0):
    a = to_canonical(build(seed=3))
    classes = {"residual": residual, **PLANTED}
    planted = Transform.sample(SymmetrySpec.from_model(a), classes, torch.Generator().manual_seed(seed))
    assert bool((planted["residual"].signs < 0).any())
    return a, apply(planted, a)


@pytest.mark.parametrize("build", [tiny_olmo2, tiny_gemma2, tiny_gemma3, tiny_llama], ids=lambda b: b.__name__)
def test_weight_matching_recovers_a_planted_signed_permutation_and_permutations_do_not(build):
    a, b = _planted(build)
    transform, _ = weight_matching(a, b, residual="signed_permutation", max_iter=6)
    assert isinstance(transform["residual"], SignedPermutation)
    assert _worst(a, b, transform) < 1e-5
    unsigned, _ = weight_matching(a, b, residual="permutation", max_iter=6)
    assert _worst(a, b, unsigned) > 1e-2


def test_activation_matching_reads_the_signs_from_the_correlations(tmp_path):
    a, b = _planted(tiny_olmo2, seed=1)
    matcher = ActivationMatcher(residual_map="signed_permutation", batches=2)
    alignment = matcher.match(a, b, MatchContext(data=next_token_data(61), run_dir=tmp_path))
    found = alignment.transform["residual"]
    expected = weight_matching(a, b, residual="signed_permutation", max_iter=6)[0]["residual"]
    assert isinstance(found, SignedPermutation)
    assert torch.equal(found.perm, expected.perm) and torch.equal(found.signs, expected.signs)


def test_learned_matching_keeps_the_signs_weight_matching_found():
    from glmc.matching.learned import residual_flips, signed, unsigned

    a, b = _planted(tiny_gemma2)
    start = weight_matching(a, b, residual="signed_permutation", max_iter=6)[0]
    flips = residual_flips(start)
    # B flipped first, then the start's order alone: the start itself
    order = unsigned(start)["residual"]
    assert torch.equal(signed(Transform({"residual": order}), flips)["residual"].dense(), start["residual"].dense())
    assert _worst(a, apply(flips, b), Transform({**unsigned(start)})) < 1e-5


def test_an_export_of_a_flipped_sandwich_model_reloads(tmp_path):
    hf = tiny_olmo2()
    model = to_canonical(hf)
    flipped = apply(Transform.sample(SymmetrySpec.from_model(model), {"residual": "signed_permutation"}), model)
    loaded = type(hf).from_pretrained(export_hf(flipped, hf, tmp_path / "out")).eval()
    x = inputs_for(hf)
    with torch.no_grad():
        assert_close_rel(loaded(x).logits, hf(x).logits, FORWARD, "exported flipped model vs original")
        # the gains moved with their coordinates and kept their signs
        assert torch.equal(
            loaded.model.layers[0].post_attention_layernorm.weight.abs().sort().values,
            hf.model.layers[0].post_attention_layernorm.weight.abs().sort().values,
        )


@pytest.mark.parametrize("method", ["learned", "learned_dual"])
def test_learned_matching_starts_from_the_signed_solution_and_keeps_it(method, tmp_path):
    import glmc

    a, b = _planted(tiny_olmo2, seed=2)
    settings = dict(max_steps=1, lr=1e-7, weight_max_iter=6, checkpoint_every=10**6)
    alignment = glmc.align(a, b, method, next_token_data(61), run_dir=tmp_path, **settings)
    assert isinstance(alignment.transform["residual"], SignedPermutation)
    assert _worst(a, b, alignment.transform) < 1e-5
