"""Every matcher that runs on a post-norm encoder keeps B's function (or says it does not), and the
data-free ones recover a hidden permutation of a BERT."""

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import glmc
from glmc.metrics import IGNORE_INDEX
from glmc.models import relative_deviation, to_canonical
from glmc.symmetry import SymmetrySpec, Transform, apply

from numeric import FEW_OPS, FORWARD, assert_close_rel, assert_params_close_rel
from tiny_hf import tiny_encoder

pytestmark = pytest.mark.numeric


def masked_batches(vocab=53, n=48, seq=11, seed=0):
    """Masked-LM batches: random ids, a target at about 15 % of the positions."""
    g = torch.Generator().manual_seed(seed)
    inputs = torch.randint(5, vocab, (n, seq), generator=g)
    targets = torch.where(torch.rand(n, seq, generator=g) < 0.15, inputs, IGNORE_INDEX)
    targets[:, 1] = inputs[:, 1]  # every window counts at least one position
    return DataLoader(TensorDataset(inputs, targets), batch_size=16)


@pytest.fixture(scope="module")
def pair():
    return tiny_encoder("bert", seed=0), tiny_encoder("bert", seed=1), masked_batches()


PRESERVING = {
    "weight": dict(residual="permutation"),
    "weight_perm": {},
    "activation identity, two-stage heads": dict(residual="identity", heads="two_stage"),
    "activation first, monotonic heads": dict(residual="first", heads="monotonic"),
    "activation last": dict(residual="last"),
    "activation all": dict(residual="all"),
    "rotation with rescaling": dict(rescale=True),
    "learned, permuted residual": dict(residual="permutation", max_steps=2, lr=1e-3),
}


@pytest.mark.parametrize("case", list(PRESERVING))
def test_aligned_b_computes_b(pair, case):
    hf_a, hf_b, data = pair
    method = case.split(",")[0].split(" ")[0]
    alignment = glmc.align(hf_a, hf_b, method, data, **PRESERVING[case])
    x = next(iter(data))[0]
    assert alignment.function_preserving
    with torch.no_grad():
        for variant, aligned in {case: alignment, **alignment.variants}.items():
            assert_close_rel(aligned.model(x), hf_b(x).logits, FORWARD, f"bert {variant}: aligned B vs B")


@pytest.mark.parametrize("options", [dict(residual="separate"), dict(residual="identity", heads="ignore")])
def test_paper_003_variants_that_are_not_symmetries_say_so(pair, options):
    hf_a, hf_b, data = pair
    alignment = glmc.align(hf_a, hf_b, "activation", data, **options)
    x = next(iter(data))[0]
    assert not alignment.function_preserving and alignment.transform is None
    with torch.no_grad():
        assert relative_deviation(alignment.model(x), hf_b(x).logits) > 1e-2


@pytest.mark.parametrize("method", ["weight", "activation"])
def test_recovers_a_hidden_permutation(pair, method):
    hf_a, _, data = pair
    a = to_canonical(hf_a)
    classes = {"residual": "permutation", "heads": "permutation", "mlp": "permutation"}
    b = apply(Transform.sample(SymmetrySpec.from_model(a), classes, torch.Generator().manual_seed(3)), a)
    options = dict(residual="permutation") if method == "weight" else dict(residual="all")
    got = glmc.align(a, b, method, data, **options).model.params()
    assert_params_close_rel(got, a.params(), FEW_OPS, f"bert {method}: recovered A")


def test_orthogonal_residual_is_refused(pair):
    hf_a, hf_b, _ = pair
    with pytest.raises(ValueError, match="not a symmetry"):
        glmc.align(hf_a, hf_b, "weight", residual="orthogonal")


def test_widening_a_post_norm_stream_is_refused(pair):
    from glmc.symmetry.embed_width import embed_width

    a = to_canonical(pair[0])
    with pytest.raises(ValueError, match="LayerNorm"):
        embed_width(a, a.width + 4)
    wider_mlp = embed_width(a, a.width, mlp=80)  # the MLP and the heads still widen exactly
    x = next(iter(pair[2]))[0]
    with torch.no_grad():
        assert_close_rel(wider_mlp(x), a(x), FORWARD, "bert with a widened MLP")


def test_masked_lm_vocabulary_counts_the_inputs(pair):
    hf_a, hf_b, data = pair
    seen = torch.cat([torch.cat([x.flatten(), y[y >= 0]]) for x, y in data]).unique()
    alignment = glmc.align(hf_a, hf_b, "weight", data, residual="permutation", max_iter=2)
    assert alignment.diagnostics["vocabulary_rows"] == seen.numel()  # not only the masked targets
