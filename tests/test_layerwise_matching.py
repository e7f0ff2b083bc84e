"""Weight matching holding B's transformed weights layer by layer (large models) finds the same
transform, to the bit, as holding them whole: on the grouped rotary (Llama), circuit-form (GPT-2) and
post-norm (BERT) paths."""

import pytest
import torch

from glmc.matching.engine.layerwise import LayerwiseParams
from glmc.matching.weight import weight_matching
from glmc.models import to_canonical
from glmc.models.families.roles import layer_of
from glmc.symmetry import SymmetrySpec, Transform, apply, apply_params

from tiny_hf import tiny_encoder, tiny_gpt2, tiny_llama

BUILDERS = {"llama": tiny_llama, "gpt2": tiny_gpt2, "bert": tiny_encoder}


@pytest.mark.parametrize("family", list(BUILDERS))
def test_layerwise_search_equals_the_whole_one(family):
    a, b = (to_canonical(BUILDERS[family](seed=s)) for s in (0, 1))
    residual = "permutation" if family == "bert" else "orthogonal"
    whole, d_whole = weight_matching(a, b, residual, max_iter=2, layerwise=False)
    layered, d_layered = weight_matching(a, b, residual, max_iter=2, layerwise=True)
    assert d_layered["objective"] == d_whole["objective"]
    assert set(whole) == set(layered)
    moved, moved_layered = apply(whole, b).params(), apply(layered, b).params()
    for name, t in moved.items():
        assert torch.equal(t, moved_layered[name]), name


def test_layerwise_params_hold_one_layer_and_match_a_whole_apply():
    model = to_canonical(tiny_llama(seed=0, layers=3))
    spec = SymmetrySpec.from_model(model)
    blocks = {k: v for k, v in model.params().items() if k.startswith("blocks.")}
    transform = Transform.sample(spec.restricted_to(set(blocks)), {"residual": "orthogonal", "mlp": "permutation"})
    whole = apply_params(transform, spec.restricted_to(set(blocks)), blocks)
    lazy = LayerwiseParams(blocks, transform, spec.restricted_to(set(blocks)))
    assert list(lazy) == list(blocks)
    for name in blocks:
        assert torch.equal(lazy[name], whole[name]), name
        assert len(lazy.kept) <= 2 and name in lazy.kept[layer_of(name)]  # at most two layers held


def test_a_large_search_runs_consecutive_layer_steps_together():
    from glmc.matching.engine.steps import LayerStep, Step
    from glmc.matching.weight import _runs

    class Whole(Step):
        pass

    class Layers(LayerStep):
        pass

    steps = [Whole(None, None), Layers(None, None), Layers(None, None), Whole(None, None), Layers(None, None)]
    assert [len(run) for run in _runs(steps, together=True)] == [1, 2, 1, 1]
    assert [len(run) for run in _runs(steps, together=False)] == [1, 1, 1, 1, 1]


def test_a_factored_layer_at_a_time_search_scores_its_layers_as_it_goes(monkeypatch):
    """Llama's factored search: the objective's layer share added as each layer is done, to the same floats."""
    from glmc.matching.engine.problem import LayerDistance

    a, b = (to_canonical(tiny_llama(seed=s)) for s in (0, 1))
    _, whole = weight_matching(a, b, max_iter=2, layerwise=False)
    added, add = [], LayerDistance.add
    monkeypatch.setattr(LayerDistance, "add", lambda self, state, layer: added.append(layer) or add(self, state, layer))
    _, layered = weight_matching(a, b, max_iter=2, layerwise=True)
    assert layered["objective"] == whole["objective"]
    assert added == list(range(a.num_layers)) * layered["iterations"]
