"""compose_config's shortcut (group choices composed once, plain values set on a copy as Hydra sets them) gives
the config Hydra's own compose gives, for every kind of override the suite uses."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from conftest import _composed, _plain_value, compose_config

CASES = [
    ("debug=fast", "seeds=[0,1,2]", "pairing=first", "matcher.methods=[vanilla,weight]"),
    ("experiment=table2_text", "model.hidden_size=32", "data.seq_len=64", "train.max_epochs=1"),
    ("model=gpt2_text", "data=pydoc"),
    ("debug=fast", "endpoint_models=[{},{patch_size:2},{}]", "seeds=[0,1,2]", "cache_dir=/tmp/x"),
    ("experiment=paper_vit_digits", "data.image_size=null", "matcher.learned.lr=0.01", "logger=none"),
    ("debug=fast", "train.gradient_clip_val=nan", "eval.num_lambdas=3", "data.limit_train=8"),
    ("seeds=[0,1]", "endpoints=spawn", "endpoints.steps=[0,2]", "threads=1"),
]


@pytest.mark.parametrize("overrides", CASES, ids=lambda o: " ".join(o)[:60])
def test_the_shortcut_gives_hydras_config(overrides):
    assert any(_plain_value(o) for o in overrides) or overrides == CASES[2]
    ours = OmegaConf.to_yaml(compose_config(*overrides))
    assert ours == OmegaConf.to_yaml(_composed(tuple(overrides)))


def test_a_value_hydra_refuses_raises_hydras_error():
    with pytest.raises(Exception) as ours:
        compose_config("debug=fast", "train.max_epochs=many")
    with pytest.raises(Exception) as hydras:
        _composed(("debug=fast", "train.max_epochs=many"))
    assert type(ours.value) is type(hydras.value) and str(ours.value) == str(hydras.value)


def test_what_is_not_a_plain_value():
    assert not any(map(_plain_value, ("model=gpt2_text", "hydra/launcher=local_grid", "~merge", "hydra.run.dir=x")))
    assert all(map(_plain_value, ("model.hidden_size=3", "+foo=1", "seeds=[0,1]")))
