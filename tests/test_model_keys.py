"""Model keys a family does not read are refused, never silently ignored: every family declares the keys
its build reads (Family.model_keys), the declaration is checked against what build reads, and the config
check refuses any other key set away from its default, naming the key and the family; the keys it reads
are checked for their ranges and all of them are in the endpoint cache key."""

from __future__ import annotations

import copy
import functools
import re
from dataclasses import fields

import pytest
from omegaconf import OmegaConf

from glmc.config import ModelConfig
from glmc.models.families import family_named, family_names
from glmc.models.families.base import COMMON_MODEL_KEYS
from glmc.pipeline.endpoints import cache_key
from glmc.pipeline.validate import ConfigError, validate_config

from conftest import compose_config

# a composed run of every family, which passes the config check as it is
RUNS = {
    "vit": (),
    "gpt2": ("experiment=demo_text",),
    "bert": ("experiment=bert_mlm",),
    "roberta": ("experiment=roberta_finetune",),
    "llama": ("experiment=llama_text",),
    "gemma": ("experiment=llama_text", "model=gemma_text"),
    "gemma2": ("experiment=llama_text", "model=gemma2_text"),
    "gemma3": ("experiment=llama_text", "model=gemma3_text"),
    "qwen3": ("experiment=llama_text", "model=qwen3_text"),
    "olmo2": ("experiment=llama_text", "model=olmo2_text"),
    "mixtral": ("experiment=llama_text", "model=mixtral_text"),
    "qwen2_moe": ("experiment=llama_text", "model=qwen2_moe_text"),
    "qwen3_moe": ("experiment=llama_text", "model=qwen3_moe_text"),
    "olmoe": ("experiment=llama_text", "model=olmoe_text"),
    "opt": ("experiment=demo_text", "model=opt_text"),
    "gpt_neox": ("model=pythia_text", "data=pydoc"),
}
# per family-specific key: values of its type, the first differing from the schema's default (the first one
# that differs from a run's own value is used)
CHANGED = {
    "image_size": (16, 32),
    "patch_size": (1, 2),
    "num_channels": (3, 2),
    "num_labels": (7, 5),
    "qkv_bias": (False,),
    "vocab_size": (300, 400),
    "max_positions": (96, 80),
    "num_experts": (6, 3),
    "experts_per_token": (1, 3),
    "head": ("classification", "mlm"),
    "type_vocab_size": (3, 4),
    "num_kv_heads": (1, 4),
    "tie_embeddings": (True, False),
    "rope_theta": (500.0, 800.0),
    "rotary_pct": (0.5, 1.0),
    "parallel_residual": (False, True),
}


def _changed(cfg, key: str):
    """A value of model.`key` that differs from `cfg`'s own (the schema's default, where the family does not
    read it: the run passes the check)."""
    return next(v for v in CHANGED[key] if v != cfg.model[key])


def _compose(family: str, *overrides: str):
    return compose_config("debug=fast", *RUNS[family], *overrides)


@functools.cache
def _passing(family: str):
    """The family's run, checked once per test process: it passes the config check as it is."""
    cfg = _compose(family)
    validate_config(cfg)
    return cfg


def _with_changed(cfg, key: str):
    """A copy of `cfg` with model.`key` set to `_changed` (as the override would set it)."""
    changed = copy.deepcopy(cfg)
    OmegaConf.update(changed, f"model.{key}", _changed(cfg, key))
    return changed


class _Reads:
    """A model config that records every key read from it."""

    def __init__(self, cfg):
        self._cfg, self.read = cfg, set()

    def __getattr__(self, key):
        self.read.add(key)
        return getattr(self._cfg, key)


def test_every_family_has_a_run_here_and_every_key_a_changed_value():
    assert set(RUNS) == set(family_names())
    assert {f.name for f in fields(ModelConfig)} == {*COMMON_MODEL_KEYS, *CHANGED}


@pytest.mark.parametrize("family", family_names())
def test_a_family_declares_exactly_the_keys_its_build_reads(family):
    sizes = dict(hidden_size=16, num_layers=1, num_heads=2, mlp_size=32, vocab_size=50)
    cfg = _Reads(ModelConfig(family=family, **sizes, **family_named(family).fixed_model_values))
    family_named(family).build(cfg)
    assert cfg.read == set(family_named(family).reads_model_keys()) - {"name", "family"}


@pytest.mark.parametrize(
    "family,key",
    [(f, k) for f in family_names() for k in CHANGED if k not in family_named(f).reads_model_keys()],
)
def test_a_key_the_family_does_not_read_is_refused_naming_key_and_family(family, key):
    cfg = _passing(family)
    with pytest.raises(ConfigError) as err:
        validate_config(_with_changed(cfg, key))
    assert re.search(rf"model\.{key}=\S+: model\.family={family} does not read it.*remove the setting", str(err.value))


@pytest.mark.parametrize("family", family_names())
def test_every_key_the_family_reads_is_in_the_endpoint_cache_key(family):
    cfg = _compose(family)
    base = cache_key(cfg)
    for key in family_named(family).model_keys:
        assert cache_key(_with_changed(cfg, key)) != base, key


def test_the_reported_gpt2_settings_are_refused_before_any_work():
    with pytest.raises(ConfigError) as err:
        validate_config(compose_config("experiment=demo_text", "model.num_kv_heads=1", "model.rope_theta=-5"))
    message = str(err.value)
    assert "model.num_kv_heads=1: model.family=gpt2 does not read it" in message
    assert "model.rope_theta=-5.0: model.family=gpt2 does not read it" in message


@pytest.mark.parametrize(
    "family,override,message",
    [
        ("llama", "model.rope_theta=-5", "model.rope_theta=-5.0: use a finite number > 0"),
        ("llama", "model.rope_theta=0", "model.rope_theta=0.0: use a finite number > 0"),
        ("llama", "model.num_kv_heads=3", "model.num_kv_heads=3: key/value heads must be at least 1 and divide"),
        ("llama", "model.num_kv_heads=0", "model.num_kv_heads=0: key/value heads must be at least 1"),
        ("bert", "model.type_vocab_size=0", "model.type_vocab_size=0: use at least 1"),
        ("gpt2", "model.hidden_act=swishy", "model.hidden_act=swishy: unsupported activation 'swishy'"),
        ("vit", "model.patch_size=3", "model.patch_size=3: does not divide model.image_size=8"),
    ],
)
def test_values_out_of_range_are_refused_naming_the_key(family, override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate_config(_compose(family, override))


def test_values_in_range_pass():
    validate_config(_compose("llama", "model.num_kv_heads=1", "model.rope_theta=500"))
    validate_config(_compose("llama", "model.num_kv_heads=null"))


def test_an_endpoint_model_with_a_key_its_family_does_not_read_is_refused_naming_the_entry():
    entries = "endpoint_models=[{},{hidden_size:8,num_heads:1,mlp_size:16,rope_theta:500}]"
    hetero = ("seeds=[0,1]", "pairing=first", "matcher.methods=[weight]")
    validate_config(compose_config("debug=fast", *hetero, entries.replace(",rope_theta:500", "")))
    expected = "endpoint_models[1] (seed 1): model.rope_theta=500.0: model.family=vit does not read it"
    with pytest.raises(ConfigError, match=re.escape(expected)):
        validate_config(compose_config("debug=fast", *hetero, entries))


def test_an_unread_key_set_to_its_default_passes():
    validate_config(_compose("gpt2", f"model.rope_theta={ModelConfig().rope_theta}", "model.num_kv_heads=null"))
