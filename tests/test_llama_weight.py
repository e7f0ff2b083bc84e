"""Weight matching on Llama-style models: a hidden symmetry of every Llama class (orthogonal residual,
key/value groups, query heads within groups, rotary rotation-scalings, value rotations with rescaling,
MLP permutation and up/down scaling) is recovered for group sizes 1, 2 and 4; the config refuses
circuit interpolation of rotary heads."""

import re

import pytest
import torch

from glmc.matching.weight import weight_matching
from glmc.models import to_canonical
from glmc.pipeline.validate import ConfigError, validate_config
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
    assert {"qheads.0", "qk.0", "vo.0", "mlp_scale.0"} <= set(transform)
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


def test_config_refuses_circuits_for_rotary_heads():
    cfg = compose_config("debug=fast", "data=pydoc", "model=llama_text", "matcher.methods=[weight]")
    with pytest.raises(ConfigError, match=re.escape("matcher.weight.qk=circuit: model.family=llama has no circuit")):
        validate_config(cfg)
    validate_config(compose_config("debug=fast", "data=pydoc", "model=llama_text", "symmetry=rotary"))
