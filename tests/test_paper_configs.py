"""Paper-size models on the embedded data: digits resized for the 32x32 CIFAR ViT, and the paper
configs at their own model size on CPU under debug=fast_full_size."""

from __future__ import annotations

import json
import math

import pytest
import torch

from glmc.data.module import DataModule
from glmc.pipeline.run import run_pipeline
from glmc.pipeline.validate import ConfigError, validate_config

from conftest import compose_config


def test_digits_resized_to_32_are_standardised_and_keep_the_split():
    cfg = compose_config("experiment=paper_vit_digits")
    dm = DataModule(cfg.data)
    dm.setup()
    images, labels = dm.train_set.tensors
    assert images.shape[1:] == (1, 32, 32) and dm.test_set[0][0].shape == (1, 32, 32)
    # standardised after resizing, with the training split's statistics
    assert abs(images.mean().item()) < 1e-4 and abs(images.std().item() - 1) < 1e-3
    native = DataModule(compose_config().data)
    native.setup()
    assert torch.equal(labels, native.train_set.tensors[1])  # resizing does not move the split
    # 8 is the native size: the same tensors as no resize at all
    same = DataModule(compose_config("data.image_size=8").data)
    same.setup()
    assert torch.equal(same.train_set.tensors[0], native.train_set.tensors[0])


def test_augmented_shifts_stay_within_an_eighth_of_the_image():
    cfg = compose_config("experiment=paper_vit_digits", "data.augment=true")
    dm = DataModule(cfg.data)
    dm.setup()
    padded = dm.train_set.images[0]
    assert padded.shape == (1, 40, 40)  # padded by 32 // 8 = 4 on every side
    offsets = set()
    torch.manual_seed(0)
    for _ in range(60):
        x, _ = dm.train_set[0]
        assert x.shape == (1, 32, 32)
        crops = {(dy, dx): padded[:, dy : dy + 32, dx : dx + 32] for dy in range(9) for dx in range(9)}
        found = [offset for offset, crop in crops.items() if torch.equal(x, crop)]
        assert found, "a sample is not a crop of the padded image"
        offsets.update(found)
    shifts = {abs(dy - 4) for dy, _ in offsets} | {abs(dx - 4) for _, dx in offsets}
    assert max(shifts) > 1  # shifts beyond one pixel happen at 32x32


@pytest.mark.parametrize(
    "overrides",
    [
        ["data.image_size=4"],  # smaller than the native 8x8
        ["data=pydoc", "model=gpt2_text", "data.image_size=32"],  # not the digits
        ["data=cifar10", "model=vit_cifar", "data.image_size=32"],
        ["data.image_size=32"],  # the default 8x8 ViT would get 32x32 images
        ["experiment=paper_vit_digits", "data.image_size=null"],  # the 32x32 ViT would get 8x8 ones
    ],
)
def test_bad_image_size_is_an_error_naming_the_key(overrides):
    with pytest.raises(ConfigError, match=r"data\.image_size"):
        validate_config(compose_config(*overrides))


def _finishes(tmp_path, overrides, methods):
    run_dir = tmp_path / "run"
    cfg = compose_config(
        *overrides,
        "debug=fast_full_size",
        f"cache_dir={tmp_path / 'endpoints'}",
        "logger=none",
        "seeds=[0,1]",
        "train.max_epochs=1",
        "eval.num_lambdas=3",
        f"matcher.methods=[{','.join(methods)}]",
    )
    run_pipeline(cfg, run_dir)
    saved = json.loads((run_dir / "results.json").read_text())
    assert set(saved["methods"]) == set(methods)
    for method in methods:
        assert math.isfinite(saved["methods"][method]["barrier"]), method
    return cfg, saved


@pytest.mark.slow
def test_paper_vit_on_digits_runs_at_full_size_on_cpu(tmp_path):
    cfg, saved = _finishes(
        tmp_path,
        [
            "experiment=paper_vit_digits",
            "model=vit_cifar_digits",
            "data.limit_train=8",  # one step of each at the full size: what is checked is that the size runs
            "data.limit_test=8",
            "data.batch_size=8",
            "matcher.weight.max_iter=1",  # the learned start too
            "matcher.learned.max_steps=1",
        ],
        ["vanilla", "weight", "learned"],
    )
    assert (cfg.model.num_layers, cfg.model.hidden_size, cfg.model.image_size) == (6, 256, 32)
    assert saved["model"] == "vit_cifar_digits" and saved["dataset"] == "digits"


@pytest.mark.slow
def test_paper_gpt2_on_embedded_corpus_runs_at_full_size_on_cpu(tmp_path):
    cfg, saved = _finishes(
        tmp_path,
        [
            "experiment=paper_gpt2_embedded",
            "model=gpt2_shakespeare",
            "data.limit_train=4",
            "data.limit_test=2",
            "data.batch_size=4",
            "data.seq_len=64",  # the model keeps its 256 positions; shorter windows train faster
            "matcher.weight.max_iter=1",
        ],
        ["vanilla", "weight"],
    )
    assert (cfg.model.num_layers, cfg.model.hidden_size, cfg.model.mlp_size) == (6, 256, 1024)
    assert saved["model"] == "gpt2_shakespeare" and saved["dataset"] == "pydoc"
