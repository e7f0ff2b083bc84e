"""trainer.precision: mixed precision trains float32 master weights, alignment and the barriers are
evaluated in float32, `auto` resolves at run time (bf16-mixed on a card with native bfloat16, else
32-true) and 16-mixed is refused on CPU."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file

from glmc.pipeline.endpoints import cache_key
from glmc.pipeline.run import run_pipeline
from glmc.pipeline.validate import ConfigError, validate_config
from glmc.train.trainer import resolve_precision, trained_precision, trainer_factory

from conftest import compose_config

METHODS = ("vanilla", "weight", "learned")
# debug=fast's one-layer ViT, learned matching cut to a few steps: seconds per run
FAST = (f"matcher.methods=[{','.join(METHODS)}]", "matcher.learned.max_steps=3", "matcher.learned.epoch_test_batches=0")
# bfloat16 keeps 8 bits of mantissa: a forward in it rounds the loss (about 2.3 nats here) by up to
# 2.3 * 2^-8 = 0.009 nats, and endpoints trained on such rounded gradients drift apart from the float32 ones
# by about as much; their barriers (evaluated in float32) differed by at most 0.0007 nats when measured
BARRIER_TOL = 0.01


def test_a_bf16_mixed_run_trains_float32_weights_and_keeps_the_barriers(tmp_path, tiny_overrides):
    cache = tmp_path / "bf16_endpoints"
    runs = {
        "auto": run_pipeline(compose_config(*tiny_overrides, *FAST, "trainer.precision=auto"), tmp_path / "auto"),
        "bf16": run_pipeline(
            compose_config(*tiny_overrides, *FAST, "trainer.precision=bf16-mixed", f"cache_dir={cache}"),
            tmp_path / "bf16",
        ),
    }
    assert runs["auto"]["train_precision"] == "32-true"  # auto on CPU
    assert runs["bf16"]["train_precision"] == "bf16-mixed"
    assert runs["bf16"]["eval_dtype"] == "float32" and runs["bf16"]["stored_dtype"] == "float32"
    weights = sorted(cache.rglob("model.safetensors"))
    assert len(weights) == 2  # the float32 run's entries are keyed apart (trainer.precision is in the key)
    assert {t.dtype for path in weights for t in load_file(path).values()} == {torch.float32}  # master weights
    for name in METHODS:
        full, mixed = runs["auto"]["methods"][name]["barrier"], runs["bf16"]["methods"][name]["barrier"]
        assert math.isfinite(mixed) and abs(mixed - full) <= BARRIER_TOL, (name, full, mixed)


def test_auto_is_32_true_on_cpu_and_keys_the_cache_as_it():
    assert resolve_precision("auto", "cpu") == "32-true"
    gpu = compose_config("debug=fast", "trainer=gpu")
    assert gpu.trainer.precision == "auto"
    if not torch.cuda.is_available():
        assert trained_precision(gpu.trainer) == "32-true"
    auto, plain = compose_config("debug=fast"), compose_config("debug=fast")
    auto.trainer.precision = "auto"
    assert plain.trainer.precision == "32-true" and cache_key(auto) == cache_key(plain)
    assert trainer_factory(auto.trainer)(logger=False).precision == "32-true"


@pytest.mark.parametrize(
    "precision, says",
    [("16-mixed", "float16 autocast needs a GPU"), ("bf16-true", "glmc trains float32 weights"), ("64-true", "use")],
)
def test_refused_precisions_name_the_setting(precision, says):
    cfg = compose_config("debug=fast")
    cfg.trainer.precision = precision
    with pytest.raises(ConfigError, match=f"trainer.precision={precision}: .*{says}"):
        validate_config(cfg)
    with pytest.raises(ValueError, match=f"trainer.precision={precision}"):
        trainer_factory(cfg.trainer)


def test_16_mixed_is_left_to_lightning_on_a_gpu_accelerator():
    assert resolve_precision("16-mixed", "gpu") == "16-mixed"
    assert resolve_precision("bf16-mixed", "cpu") == "bf16-mixed"
