"""Each check lives with what it checks: a setting's range is declared with the setting (glmc.config), the
data settings are checked from the dataset's registry entry (glmc.data.checks), a model's from its family
(glmc.pipeline.model_checks, Family.model_problems), and validate_config asks each part in turn."""

from __future__ import annotations

import ast
import re

import pytest
from omegaconf import OmegaConf

from glmc.config import DataConfig, MergeConfig, ModelConfig, TrainConfig
from glmc.data.checks import data_problems
from glmc.models.families import family_named
from glmc.pipeline.model_checks import model_problems
from glmc.pipeline.validate import ConfigError, validate_config
from glmc.ranges import declared

from conftest import ROOT, compose_config


def test_the_ranges_of_the_run_sections_are_declared_with_their_settings():
    ranged = {schema: {d.name for d in declared(schema) if d.rule} for schema in (ModelConfig, DataConfig)}
    assert {"hidden_size", "dropout", "rotary_pct", "patch_size"} <= ranged[ModelConfig]
    assert {"seq_len", "split_seed", "mask_seed"} <= ranged[DataConfig]
    assert {d.name for d in declared(TrainConfig)} >= {"weight_decay", "parallel_endpoints"}
    assert {d.name for d in declared(MergeConfig)} == {"batches", "regmean_alpha"}


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("train.warmup_fraction", 1.5, "train.warmup_fraction=1.5: use a value in [0, 1)"),
        ("merge.regmean_alpha", 2.0, "merge.regmean_alpha=2.0: use a value in [0, 1]"),
        ("data.split_seed", -1, "data.split_seed=-1: use a seed in [0, 2^32)"),
        ("model.dropout", 1.0, "model.dropout=1.0: use a value in [0, 1)"),
    ],
)
def test_a_declared_range_is_refused_by_the_one_pass(key, value, message):
    cfg = compose_config("debug=fast")  # composed once, copied per test
    OmegaConf.update(cfg, key, value)
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate_config(cfg)


def test_the_data_check_reads_the_dataset_entry():
    cfg = compose_config("debug=fast")
    assert data_problems(cfg) == []
    OmegaConf.update(cfg, "data.task", "masked_lm")  # digits has no masked-LM windows
    OmegaConf.update(cfg, "data.image_size", 4)  # below digits' native 8x8
    problems = data_problems(cfg)
    assert problems[0].startswith("data.task=masked_lm: data=digits has no masked-LM windows; use data=pydoc_mlm")
    assert problems[-1].startswith("data.image_size=4: data=digits's images are 8x8")


def test_the_model_check_asks_the_family():
    cfg = compose_config("debug=fast")
    assert model_problems(cfg) == []
    OmegaConf.update(cfg, "model.patch_size", 3)
    assert model_problems(cfg) == [
        "model.patch_size=3: does not divide model.image_size=8; choose a patch size that divides the image "
        "size (e.g. 2)"
    ]
    llama = OmegaConf.create({"num_kv_heads": 3, "num_heads": 4})
    assert (
        family_named("llama")
        .model_problems(llama, "model", {"num_kv_heads"})[0]
        .startswith("model.num_kv_heads=3: key/value heads must be at least 1 and divide model.num_heads=4")
    )
    assert family_named("llama").model_problems(llama, "model", {"vocab_size"}) == []  # not its keys
    assert family_named("gpt2").model_problems(llama, "model", {"num_kv_heads"}) == []  # reads no such key


def test_the_run_check_names_no_dataset_or_family_attribute():
    """validate.py asks the parts; what a dataset or a family allows is not spelled out there."""
    source = (ROOT / "src/glmc/pipeline/validate.py").read_text()
    imported = {n.module for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ImportFrom)}
    assert "glmc.datasets" not in imported
    for attribute in ("task_heads", "fixed_model_values", "resizable", "wordpiece", "patch_size", "num_kv_heads"):
        assert attribute not in source, attribute


def test_the_pairing_checks_its_seeds_and_folders():
    from glmc.pipeline.pairing import folder_count_problems, seed_problems

    assert seed_problems([0, 1], "disjoint") == [] and folder_count_problems(4, "disjoint") == []
    assert seed_problems([0, 1, 1], "all")[0].startswith("seeds=[0, 1, 1]: seed 1 appears more than once")
    assert seed_problems([0, 1, 2], "disjoint") == ["seeds=[0, 1, 2]: pairing=disjoint needs an even number of seeds"]
    assert folder_count_problems(2, "universe") == [
        "endpoints.paths holds 2 folders: pairing=universe aligns three or more models; give at least 3"
    ]
