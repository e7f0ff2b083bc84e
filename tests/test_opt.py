"""OPT (pre-LN, learned positions with an offset of 2, q/k/v/out biases, ReLU MLP, tied head): exact
conversion, every symmetry its spec claims (ReLU: MLP semi-permutations too), matchers that keep B, an
export reloaded with from_pretrained, the layouts it refuses, and run.py on two folders."""

import pytest
import torch

from glmc.models import to_canonical
from glmc.models.export import export_hf
from glmc.models.families import family_named
from glmc.pipeline.validate import ConfigError, validate_config

from conftest import compose_config
from family_checks import (
    MATCHERS,
    assert_alignment_keeps_b,
    assert_symmetry_keeps_function,
    claimed,
    cli_on_two_folders,
    next_token_data,
)
from numeric import FORWARD, assert_close_rel
from tiny_hf import inputs_for, tiny_opt

pytestmark = pytest.mark.numeric


@pytest.fixture(scope="module")
def opt():
    hf = tiny_opt()
    return hf, to_canonical(hf), inputs_for(hf)


def test_conversion_matches_hf(opt):
    hf, model, x = opt
    assert model.config.activation == "relu" and model.task == "causal_lm"
    with torch.no_grad():
        expected = hf(x).logits
        assert_close_rel(model(x), expected, FORWARD, "canonical vs HF logits")
        # positions come from the attention mask (all ones: 0, 1, ...); rows 0 and 1 serve padding only
        assert_close_rel(hf(x, attention_mask=torch.ones_like(x)).logits, expected, FORWARD, "with a mask")
        assert_close_rel(model.to_circuit()(x), expected, FORWARD, "circuit form vs HF logits")
    table = hf.model.decoder.embed_positions.weight
    assert model.params()["embed.pos"].shape == (hf.config.max_position_embeddings, hf.config.hidden_size)
    centred = table[2:] - table[2:].mean(1, keepdim=True)
    assert_close_rel(model.params()["embed.pos"], centred, FORWARD, "positions read from row 2 on")
    assert family_named("opt").input_limits(model.params()) == {"positions": 16, "vocab": 61}


def test_biasless_and_non_affine_layouts_convert():
    hf = tiny_opt(layers=1, enable_bias=False, layer_norm_elementwise_affine=False)
    x = inputs_for(hf)
    with torch.no_grad():
        assert_close_rel(to_canonical(hf)(x), hf(x).logits, FORWARD, "no biases, no LayerNorm affine")


@pytest.mark.parametrize(
    "setting,message",
    [
        (dict(do_layer_norm_before=False), "do_layer_norm_before=False"),
        (dict(word_embed_proj_dim=8), "word_embed_proj_dim=8 != hidden_size=16"),
    ],
)
def test_unsupported_layouts_are_refused_naming_the_setting(setting, message):
    with pytest.raises(NotImplementedError, match=message):
        to_canonical(tiny_opt(layers=1, **setting))


def test_layer_norm_eps_is_fixed():
    """OPTConfig has no LayerNorm eps: any other model.layer_norm_eps is refused before any work."""
    cfg = compose_config("experiment=demo_text", "model=opt_text")
    validate_config(cfg)
    with pytest.raises(ConfigError, match=r"model.layer_norm_eps=1e-06: model.family=opt fixes it at 1e-05"):
        validate_config(compose_config("experiment=demo_text", "model=opt_text", "model.layer_norm_eps=1e-6"))
    cfg.model.layer_norm_eps = 1e-6
    with pytest.raises(ValueError, match="OPT's LayerNorms have eps 1e-05"):
        family_named("opt").build(cfg.model)


CASES = {
    ("residual", "orthogonal"),
    ("residual", "permutation"),
    ("heads", "permutation"),
    ("heads", "semi_permutation"),
    ("qk", "invertible"),
    ("qk", "orthogonal_scale"),
    ("vo", "invertible"),
    ("vo", "orthogonal_scale"),
    ("mlp", "permutation"),
    ("mlp", "semi_permutation"),
    ("mlp_scale", "positive_diagonal"),
}


def test_the_cases_are_what_the_spec_claims(opt):
    assert claimed(opt[1]) == CASES


@pytest.mark.parametrize("kind,group", sorted(CASES))
def test_symmetry_preserves_function(opt, kind, group):
    _, model, x = opt
    assert_symmetry_keeps_function(model, x, {kind: group}, f"{kind} {group}")


@pytest.fixture(scope="module")
def pair():
    return tiny_opt(seed=0), tiny_opt(seed=1), next_token_data(61, seq=12)


@pytest.mark.parametrize("method", list(MATCHERS))
def test_alignment_keeps_b(pair, method, tmp_path):
    hf_a, hf_b, data = pair
    assert_alignment_keeps_b(hf_a, hf_b, method, data, tmp_path)


def test_export_reloads_and_matches(opt, tmp_path):
    hf, model, x = opt
    loaded = type(hf).from_pretrained(export_hf(model, hf, tmp_path / "out")).eval()
    assert not loaded.config.tie_word_embeddings
    with torch.no_grad():
        assert_close_rel(loaded(x).logits, hf(x).logits, FORWARD, "exported vs original logits")


def test_command_line_on_two_folders(monkeypatch, capsys, tmp_path):
    cli_on_two_folders(monkeypatch, capsys, tmp_path, "opt", hidden_act="relu", layer_norm_eps=1e-5, max_positions=16)
