"""symmetry=auto, the default: every family aligns without a symmetry setting, with the widest residual
class it admits, recorded in the diagnostics; a class the family cannot take is still refused."""

import pytest
import torch

import glmc
from glmc.models.families import family_named
from glmc.pipeline.validate import ConfigError, validate_config
from glmc.symmetry.family_defaults import resolve_residual, resolve_run_symmetry

from conftest import compose_config
from tiny_hf import inputs_for, tiny_encoder, tiny_gpt2, tiny_llama

BUILDERS = {"bert": tiny_encoder, "gpt2": tiny_gpt2, "llama": tiny_llama}


@pytest.mark.parametrize("family", list(BUILDERS))
def test_align_with_the_defaults_uses_the_widest_class(family):
    a, b = BUILDERS[family](seed=0), BUILDERS[family](seed=1)
    alignment = glmc.align(a, b, "weight", max_iter=2)
    widest = family_named(family).residual_classes[0]
    assert alignment.diagnostics["symmetry"] == {"residual": widest, "source": "family default"}
    x = inputs_for(b)
    with torch.no_grad():
        expected = glmc.to_canonical(b)(x)
        assert torch.allclose(alignment.model(x), expected, atol=1e-4 * expected.abs().max().item())


def test_post_norm_widest_is_permutation_and_pre_norm_orthogonal():
    assert resolve_residual("auto", family_named("bert")) == ("permutation", "family default")
    assert resolve_residual("auto", family_named("gpt2")) == ("orthogonal", "family default")
    assert resolve_residual("permutation", family_named("gpt2")) == ("permutation", "chosen")


def test_an_explicit_class_the_family_cannot_take_is_refused():
    a, b = tiny_encoder(seed=0), tiny_encoder(seed=1)
    with pytest.raises(ValueError, match="residual=orthogonal is not a symmetry of the bert family"):
        glmc.align(a, b, "weight", residual="orthogonal")
    with pytest.raises(ConfigError, match="matcher.weight.residual=orthogonal: not a symmetry"):
        validate_config(compose_config("experiment=bert_mlm", "symmetry=orthogonal"))


def test_run_config_resolves_auto_and_keeps_a_choice():
    cfg = compose_config("experiment=bert_mlm")
    cfg.symmetry.residual = "auto"
    record = resolve_run_symmetry(cfg, validate_config(cfg))
    blocks = {"attention": "full", "mlp": "plain", "head_spaces": ["qk", "vo"]}
    assert record == {"residual": "permutation", "source": "family default", "family": "bert", "blocks": blocks}
    assert cfg.matcher.weight.residual == "permutation" and cfg.matcher.learned.residual == "permutation"
    chosen = compose_config("symmetry=permutation")
    assert resolve_run_symmetry(chosen, validate_config(chosen))["source"] == "chosen"
    default = compose_config()
    assert resolve_run_symmetry(default, validate_config(default))["residual"] == "orthogonal"
