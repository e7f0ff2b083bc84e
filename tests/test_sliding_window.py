"""Sliding-window attention (Mistral in every layer, Qwen2 in the layers from max_window_layers on): the
canonical forward masks as Hugging Face does on sequences longer than the window, a symmetry keeps the
function under it, and an export carries the window into the template check."""

import dataclasses
import json
from types import SimpleNamespace

import pytest
import torch
from transformers.masking_utils import sliding_window_causal_mask_function

from glmc.models import to_canonical
from glmc.models.blocks.grouped import window_mask
from glmc.models.canonical import CanonicalConfig, CanonicalTransformer
from glmc.models.compatibility import check_compatible
from glmc.models.export import export_hf
from glmc.models.families.llama import sliding_window
from glmc.symmetry import SymmetrySpec, Transform, apply

from numeric import FORWARD, assert_close_rel, relative_error
from tiny_hf import inputs_for, tiny_llama

pytestmark = pytest.mark.numeric

WINDOW = 3  # inputs_for gives 11 tokens
KINDS = {
    "mistral": (dict(kind="mistral", window=WINDOW), (WINDOW, None)),
    "qwen2 second layer": (dict(kind="qwen2", window=WINDOW, full=1), (WINDOW, [1])),
}


def tiny(window=WINDOW, **options):
    return tiny_llama(hidden=16, mlp=24, **{**options, "window": window})


@pytest.fixture(scope="module", params=list(KINDS))
def windowed(request):
    hf = tiny(**KINDS[request.param][0])
    return request.param, hf, to_canonical(hf), inputs_for(hf)


def test_window_mask_is_hugging_faces():
    """Query i sees key j when 0 <= i - j < window: the window counts the query's own position."""
    allowed = sliding_window_causal_mask_function(WINDOW)
    positions = torch.arange(8)
    expected = allowed(0, 0, positions[:, None], positions[None, :])
    assert torch.equal(window_mask(8, WINDOW, torch.device("cpu")), expected)
    assert expected.sum(1).tolist() == [1, 2, 3, 3, 3, 3, 3, 3]


def test_conversion_matches_hf_and_the_window_matters(windowed):
    name, hf, model, x = windowed
    assert (model.config.sliding_window, model.config.sliding_layers) == KINDS[name][1]
    with torch.no_grad():
        logits = model(x)
        assert_close_rel(logits, hf(x).logits, FORWARD, f"{name}: canonical vs HF logits")
        full = dataclasses.replace(model.config, sliding_window=None, sliding_layers=None)
        error, _ = relative_error(CanonicalTransformer(full, model.params())(x), logits)
    assert error > 1e-2, f"{name}: the window changed the logits by {error:.1e} only"


def test_the_window_is_json_data(windowed):
    config = windowed[2].config
    assert CanonicalConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


def test_symmetries_preserve_function_under_the_window(windowed):
    name, _, model, x = windowed
    classes = dict(
        residual="orthogonal",
        heads="permutation",
        qheads="permutation",
        qk="rotary_scale",
        vo="invertible",
        mlp="permutation",
        mlp_scale="diagonal",
    )
    transform = Transform.sample(SymmetrySpec.from_model(model), classes, torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert_close_rel(apply(transform, model)(x), model(x), FORWARD, f"{name}: transformed logits")


def test_export_carries_the_window(windowed, tmp_path):
    name, hf, model, x = windowed
    loaded = type(hf).from_pretrained(export_hf(model, hf, tmp_path / "out")).eval()
    assert sliding_window(loaded.config) == KINDS[name][1]
    with torch.no_grad():
        assert_close_rel(loaded(x).logits, hf(x).logits, FORWARD, f"{name}: exported vs original logits")


def test_another_window_is_refused_by_export_and_alignment():
    model = to_canonical(tiny(kind="mistral"))
    for template in (tiny(kind="mistral", window=5), tiny(kind="mistral", window=None)):
        with pytest.raises(ValueError, match=r"sliding window \(size, layers\)"):
            export_hf(model, template, "unused")
    with pytest.raises(ValueError, match="model_b has a sliding window"):
        check_compatible(model, to_canonical(tiny(kind="mistral", window=5)))


def test_sliding_layers_without_a_window_size_are_refused():
    cfg = SimpleNamespace(
        model_type="qwen2", layer_types=["sliding_attention"], sliding_window=None, num_hidden_layers=1
    )
    with pytest.raises(ValueError, match="without a sliding_window"):
        sliding_window(cfg)
    cfg.layer_types = ["chunked_attention"]
    with pytest.raises(NotImplementedError, match="chunked_attention"):
        sliding_window(cfg)
