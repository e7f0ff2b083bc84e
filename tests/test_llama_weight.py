"""Weight matching on Llama-style models: a hidden symmetry of every Llama class (orthogonal residual,
key/value groups, query heads within groups, rotary rotation-scalings, value rotations with rescaling,
MLP permutation and up/down scaling) is recovered for group sizes 1, 2 and 4; rotary heads stacked as
circuits quotient the in-head symmetries."""

import pytest
import torch

from glmc.interpolation import merge_params
from glmc.matching.weight import weight_matching
from glmc.models import to_canonical
from glmc.models.canonical import CanonicalTransformer
from glmc.pipeline.validate import validate_config
from glmc.symmetry import SymmetrySpec, Transform, apply

from conftest import compose_config
from numeric import FORWARD, assert_close_rel, relative_error
from tiny_hf import tiny_llama

pytestmark = pytest.mark.numeric

HIDDEN = dict(
    residual="orthogonal",
    heads="permutation",
    qheads="permutation",
    qk="rotary_scale",
    vo="orthogonal_scale",
    mlp="permutation",
    mlp_scale="diagonal",
)


@pytest.mark.parametrize("kv_heads", [4, 2, 1], ids=["group1", "group2", "group4"])
def test_recovers_hidden_symmetry(kv_heads):
    a = to_canonical(tiny_llama(kv_heads=kv_heads))
    b = apply(Transform.sample(SymmetrySpec.from_model(a), HIDDEN, torch.Generator().manual_seed(5)), a)
    transform, diagnostics = weight_matching(a, b, dtype=torch.float64)
    query_heads = {"qheads.0"} if kv_heads < 4 else set()  # one query head per group: no such space
    assert {"qk.0", "vo.0", "mlp_scale.0"} | query_heads <= set(transform)
    assert ("qheads.0" in transform) == bool(query_heads)
    aligned = apply(transform, b)
    before, _ = relative_error(
        torch.cat([t.flatten() for t in b.params().values()]), torch.cat([t.flatten() for t in a.params().values()])
    )
    assert before > 0.5
    for name, t in a.params().items():  # every factored tensor back in place, heads included
        assert_close_rel(aligned.params()[name], t, FORWARD, f"group size {4 // kv_heads}: {name}")
    x = torch.randint(0, 61, (2, 9))
    with torch.no_grad():
        assert_close_rel(aligned(x), b(x), FORWARD, "the aligned model computes B's function")


def test_independent_models_get_closer_and_keep_function():
    a, b = to_canonical(tiny_llama(seed=0)), to_canonical(tiny_llama(seed=1))
    transform, diagnostics = weight_matching(a, b)
    objective = diagnostics["objective"]
    assert min(objective) < 0.9 * objective[0], objective
    x = torch.randint(0, 61, (2, 9))
    with torch.no_grad():
        assert_close_rel(apply(transform, b)(x), b(x), FORWARD, "aligned B")


def test_rotary_circuits_quotient_the_in_head_symmetries():
    """Heads stacked as circuits (each block rotated as its own) interpolate sum_i w_i q_i^T R k_i: a model
    merged with a copy moved by rotary rotation-scalings and invertible value maps is the same function,
    while the factored average of the two is another one."""
    a = to_canonical(tiny_llama(kv_heads=2))
    moved = apply(Transform.sample(SymmetrySpec.from_model(a), {"qk": "rotary_scale", "vo": "invertible"}), a)
    x = torch.randint(0, 61, (2, 9))
    circuit = CanonicalTransformer(a.config, merge_params([a.params(), moved.params()], [0.3, 0.7], ("qk", "vo")))
    factored = CanonicalTransformer(a.config, merge_params([a.params(), moved.params()], [0.3, 0.7]))
    with torch.no_grad():
        assert_close_rel(circuit(x), a(x), FORWARD, "rotary circuits of a model and its moved copy")
        error, _ = relative_error(factored(x), a(x))
    assert error > 1e-2, f"the factored average kept the function ({error:.1e})"


def test_llama_text_config_interpolates_heads_as_circuits():
    cfg = compose_config("experiment=llama_text")
    validate_config(cfg)
    assert (cfg.matcher.weight.qk, cfg.matcher.weight.vo) == ("circuit", "circuit")
