"""seed_vary splits an endpoint's seed in two: with `init` the endpoints differ in their initialisation
only (data order and dropout from seed_fixed), with `data` in their data order only (one initialisation,
from seed_fixed); `both` (the default) keeps the cache key and the numbers of a single seed."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from glmc.pipeline.cache import config_hash
from glmc.pipeline.endpoints import cache_key, seeds_of, train_endpoint
from glmc.pipeline.validate import ConfigError, validate_config

from conftest import compose_config

# config_hash(cache_key(compose_config("debug=fast"))) before seed_vary existed: existing caches still hit
# (of endpoints trained keeping subnormals: flushing them, the default on a CPU since, is keyed apart)
DEFAULT_KEY = "76014df2813c8f3a"


class Recorder(Callback):
    """The weights training starts from and the first batch's inputs."""

    def on_train_start(self, trainer, pl_module):
        self.init = {k: v.detach().clone() for k, v in pl_module.model.state_dict().items()}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if batch_idx == 0:
            self.batch = batch[0].clone()


def _start(tmp_path, vary: str, seed: int) -> Recorder:
    cfg = compose_config("debug=fast", f"seed_vary={vary}", "train.max_epochs=1", "trainer.limit_train_batches=1")
    recorder = Recorder()
    train_endpoint(cfg, seed, tmp_path / f"{vary}_{seed}", False, callbacks=(recorder,))
    return recorder


def _same_init(a: Recorder, b: Recorder) -> bool:
    return all(torch.equal(a.init[k], b.init[k]) for k in a.init)


@pytest.mark.parametrize("vary, init_same, order_same", [("data", True, False), ("init", False, True)])
def test_endpoints_differ_only_in_the_part_that_varies(tmp_path, vary, init_same, order_same):
    a, b = _start(tmp_path, vary, 1), _start(tmp_path, vary, 2)
    assert _same_init(a, b) is init_same
    assert torch.equal(a.batch, b.batch) is order_same


def test_the_default_keeps_the_key_and_the_other_splits_record_the_fixed_seed():
    cfg = compose_config("debug=fast", "trainer.flush_denormals=false")
    assert config_hash(cache_key(cfg)) == DEFAULT_KEY
    assert seeds_of(cfg, 3) == {"init_seed": 3, "data_seed": 3}
    split = compose_config("debug=fast", "seed_vary=init", "seed_fixed=7")
    assert cache_key(split)["seeds"] == {"vary": "init", "fixed": 7}
    assert seeds_of(split, 3) == {"init_seed": 3, "data_seed": 7}
    assert seeds_of(compose_config("debug=fast", "seed_vary=data"), 3) == {"init_seed": 0, "data_seed": 3}


def test_a_fixed_seed_out_of_range_is_refused_by_name():
    cfg = compose_config("debug=fast", "seed_fixed=-1")
    with pytest.raises(ConfigError, match=r"seed_fixed=-1: use a seed in \[0, 2\^32\)"):
        validate_config(cfg)
