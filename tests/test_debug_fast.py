"""debug=fast shrinks the experiment's own model and data (sizes only, never the model group), so every
experiment keeps its family, inputs and data and passes the config check; debug=fast_full_size keeps the
model's size. A model that cannot train on the data's task names the families that can, never "none"."""

from __future__ import annotations

import re

import pytest

from glmc.pipeline.validate import ConfigError, validate_config

from conftest import CONF, compose_config

# digits_hetero names the widths of its narrower endpoints (endpoint_models), which a shrunk first model
# cannot hold: it runs under debug=fast_full_size
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml") if p.stem != "digits_hetero")
KEPT = ("family", "name", "image_size", "patch_size", "num_channels", "num_labels", "vocab_size", "max_positions")


def _experiment(name: str) -> tuple[str, ...]:
    return () if name == "demo" else (f"experiment={name}",)


@pytest.mark.parametrize("name", ["demo", *EXPERIMENTS])
def test_debug_fast_shrinks_the_experiments_own_model_and_data(name):
    full = compose_config(*_experiment(name))
    fast = compose_config(*_experiment(name), "debug=fast")
    validate_config(fast)
    assert {k: fast.model[k] for k in KEPT} == {k: full.model[k] for k in KEPT}
    assert (fast.data.name, fast.data.task) == (full.data.name, full.data.task)
    assert fast.model.hidden_size < full.model.hidden_size and fast.model.num_layers <= full.model.num_layers
    assert fast.model.mlp_size < full.model.mlp_size
    assert fast.data.limit_train == 256 and fast.train.max_epochs == 2 and fast.eval.num_lambdas == 3


@pytest.mark.parametrize("name", ["demo_text", "paper_gpt2_embedded", "digits_hetero"])
def test_debug_fast_full_size_keeps_the_models_size(name):
    full = compose_config(*_experiment(name))
    cfg = compose_config(*_experiment(name), "debug=fast_full_size")
    validate_config(cfg)
    assert cfg.model == full.model and cfg.endpoint_models == full.endpoint_models
    assert cfg.data.limit_train == 256 and cfg.train.max_epochs == 2 and cfg.eval.num_lambdas == 3


def test_the_text_demo_under_debug_fast_keeps_its_gpt2():
    cfg = compose_config("experiment=demo_text", "debug=fast")
    assert (cfg.model.family, cfg.model.name, cfg.data.name) == ("gpt2", "gpt2_text", "pydoc")
    assert (cfg.model.hidden_size, cfg.model.num_layers, cfg.model.num_heads) == (16, 1, 2)


def test_a_model_for_another_task_names_the_families_that_fit_the_data():
    with pytest.raises(ConfigError) as err:
        validate_config(compose_config("experiment=demo_text", "debug=fast", "model=vit_tiny"))
    assert "data.task=causal_lm: model.family=vit trains on classification; choose a model of family gpt2 or llama" in (
        str(err.value)
    )
    assert "family none" not in str(err.value)


def test_a_task_no_family_trains_on_says_so_instead_of_naming_none():
    with pytest.raises(ConfigError) as err:
        validate_config(compose_config("debug=fast", "data.task=causal_lm"))
    message = str(err.value)
    assert re.search(r"data\.task=causal_lm: .*no model family trains on causal_lm with images; choose", message)
    assert "none" not in message
