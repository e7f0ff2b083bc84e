"""experiment=bert_mlm end to end at tiny size (masked-LM BERTs through training, every matcher and the
21-point paths), its config checks, and the report's tables from results folders."""

from __future__ import annotations

import itertools
import json
import math

import pytest

from glmc.pipeline.run import run_pipeline
from glmc.pipeline.validate import ConfigError, validate_config
from glmc.report import bert_mlm

from conftest import compose_config

TINY = tuple(o for o in bert_mlm.TINY if o != "model=bert_tiny") + ("data.tokenizer_vocab=300", "model.vocab_size=300")


def test_tiny_bert_mlm_run_ends_every_path_at_its_endpoints(tmp_path):
    cfg = compose_config("experiment=bert_mlm", *TINY, "seeds=[0,1]", "logger=none", f"cache_dir={tmp_path / 'e'}")
    results = run_pipeline(cfg, tmp_path / "run")
    assert results["task"] == "masked_lm" and len(results["methods"]["vanilla"]["lambdas"]) == 21
    for e in results["endpoints"]:
        assert 0 < e["test_loss"] < math.log(300) + 1
    assert list(results["methods"]) == ["vanilla", "weight", "activation", "learned"]
    for name, m in results["methods"].items():
        pair = m["pairs"][0]
        assert math.isfinite(pair["barrier_vs_mean"]) and math.isfinite(pair["barrier"]), name
        assert pair["endpoint_deviation"] < 1e-4, name


def test_the_grids_compose_and_an_orthogonal_residual_is_refused():
    for step in (bert_mlm.HEADS, bert_mlm.RESIDUAL):
        swept = [o for o in step.overrides if "," in o.split("=", 1)[1] and "[" not in o]
        key, values = swept[0].split("=", 1)
        fixed = [o for o in step.overrides if o not in swept]
        for value in values.split(","):
            validate_config(compose_config(*fixed, f"{key}={value}"))
    with pytest.raises(ConfigError, match="matcher.weight.residual=orthogonal: not a symmetry of model.family=bert"):
        validate_config(compose_config("experiment=bert_mlm", "symmetry=orthogonal"))


def _pair(seeds, barrier):
    return {"seeds": list(seeds), "barrier": barrier, "barrier_vs_mean": barrier + 0.1, "seconds": 1.0}


def _results(folder, methods, activation=None):
    folder.mkdir(parents=True)
    pairs = list(itertools.combinations(range(3), 2))
    body = {
        "config": {"matcher": {"activation": activation or {}}},
        "methods": {m: {"pairs": [_pair(p, b + 0.01 * i) for i, p in enumerate(pairs)]} for m, b in methods.items()},
    }
    (folder / "results.json").write_text(json.dumps(body))


def test_report_reads_the_three_steps(tmp_path):
    root = tmp_path / "runs"
    _results(root / "bert_mlm", {"vanilla": 2.0, "weight": 1.0, "activation": 1.2, "learned": 0.5})
    for i, heads in enumerate(("none", "monotonic", "ignore")):
        _results(root / "bert_mlm_heads" / str(i), {"activation": 1.5 + i}, {"heads": heads})
    for i, residual in enumerate(("identity", "first", "last", "all", "separate")):
        _results(root / "bert_mlm_residual" / str(i), {"activation": 2.0 + i}, {"residual": residual})
    (tmp_path / "out").mkdir()
    bert_mlm.make(root, tmp_path / "out")
    text = (tmp_path / "out" / "bert_mlm.md").read_text()
    assert "| head permutation (two-stage) | 1.310 ± 0.006 |" in text  # barrier_vs_mean of the base run's activation
    assert "two_stage < none < monotonic < ignore" in text and "— different" in text  # measured vs paper 003
    assert "identity < first < last < all < separate; paper 003's: identity < all < last < first < separate" in text
    assert "learned matching" in text and (tmp_path / "out" / "section.md").is_file()


def test_a_task_the_family_cannot_train_on_is_refused():
    with pytest.raises(ConfigError, match="data.task=masked_lm: model.family=gpt2 trains on causal_lm; choose a model"):
        validate_config(compose_config("model=gpt2_text", "data=pydoc_mlm"))
    with pytest.raises(ConfigError, match="model.head=mlm trains on masked_lm, data.task=classification"):
        validate_config(compose_config("experiment=roberta_finetune", "model.head=mlm"))
    with pytest.raises(ConfigError, match="pretrain.data.tokenizer_vocab=500 but data.tokenizer_vocab=1000"):
        validate_config(compose_config("experiment=roberta_finetune", "pretrain.data.tokenizer_vocab=500"))
