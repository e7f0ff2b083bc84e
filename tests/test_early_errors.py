"""Every setting that cannot work fails before any data is loaded or any model trained: a ConfigError
from validate_config that names the key, its value and what to use instead (positions of GPT-2
against data.seq_len, every multi.* setting, per-endpoint models, merges, held-out shares, seeds,
learning rates, unknown keys anywhere), a run folder that cannot be written, and the Python API's
checks of its inputs."""

from __future__ import annotations

import json
import os
import re

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from glmc import align, evaluate, evaluate_path
from glmc.pipeline.run import run_pipeline
from glmc.pipeline.run_folder import check_run_dir, config_differences
from glmc.pipeline.validate import ConfigError, validate_config

from conftest import compose_config, make_read_only
from tiny_hf import tiny_gpt2, tiny_vit

TEXT = ("data=pydoc", "model=gpt2_text")
UNIVERSE = ("pairing=universe", "seeds=[0,1,2]")
HETERO = ("seeds=[0,1,2]", "pairing=first", "matcher.methods=[weight]")
NARROW = "{hidden_size:8,num_heads:1,mlp_size:16}"


def refused(overrides, message: str) -> str:
    """validate_config's error for `overrides`, which must contain `message`."""
    cfg = compose_config("debug=fast", *overrides)
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        validate_config(cfg)
    return str(err.value)


CASES = [
    # 1. the windows of the text data against GPT-2's positions
    ((*TEXT, "data.seq_len=256"), "data.seq_len=256: longer than the 128 positions of the model"),
    ((*TEXT, "data.seq_len=0"), "data.seq_len=0: use at least 1"),
    (("model=gpt2_text",), "model.family=gpt2: data=digits is images"),
    # 2. multi.*, named as the config names them
    ((*UNIVERSE, "multi.step=0"), "multi.step=0.0: use a grid step in (0, 1]"),
    ((*UNIVERSE, "multi.step=1.5"), "multi.step=1.5: use a grid step in (0, 1]"),
    ((*UNIVERSE, "multi.step=0.3"), "multi.step=0.3: the barycentric grid of up to three models needs 1 / step"),
    ((*UNIVERSE, "multi.max_rounds=0"), "multi.max_rounds=0: use at least 1"),
    ((*UNIVERSE, "multi.tol=0"), "multi.tol=0.0: use a finite number > 0"),
    ((*UNIVERSE, "multi.samples=-1"), "multi.samples=-1: use 0 or more"),
    ((*UNIVERSE, "multi.max_steps=0"), "multi.max_steps=0: use at least 1"),
    ((*UNIVERSE, "multi.lr=0"), "multi.lr=0.0: the learning rate must be positive and finite"),
    ((*UNIVERSE, "multi.weight_decay=-1"), "multi.weight_decay=-1.0: use a finite number >= 0"),
    ((*UNIVERSE, "multi.warmup_fraction=1"), "multi.warmup_fraction=1.0: use a value in [0, 1)"),
    ((*UNIVERSE, "multi.concentration=0"), "multi.concentration=0.0: use a finite number > 0"),
    ((*UNIVERSE, "multi.edge_share=1.5"), "multi.edge_share=1.5: use a value in [0, 1]"),
    ((*UNIVERSE, "multi.edge_lambda=normal"), "multi.edge_lambda=normal: choose one of uniform, gaussian"),
    ((*UNIVERSE, "multi.candidates=0"), "multi.candidates=0: use at least 1"),
    ((*UNIVERSE, "multi.init_noise=-1"), "multi.init_noise=-1.0: use a finite number >= 0"),
    ((*UNIVERSE, "multi.checkpoint_every=0"), "multi.checkpoint_every=0: use at least 1"),
    ((*UNIVERSE, "multi.seed=-1"), "multi.seed=-1: use a seed in [0, 2^32)"),
    ((*UNIVERSE, "multi.methods=[]"), "multi.methods=[]: choose one or more of vanilla, weight, learned"),
    ((*UNIVERSE, "multi.methods=[weigth]"), "multi.methods=['weigth']: choose one or more of"),
    ((*UNIVERSE, "multi.pairwise=wieght"), "multi.pairwise=wieght: not a method"),
    (("pairing=universe", "seeds=[0,1]"), "seeds=[0, 1]: pairing=universe aligns three or more models"),
    # 3. per-endpoint models, merged into `model` as each endpoint trains them
    ((*HETERO, "endpoint_models=[{},{family:gpt2},{}]"), "endpoint_models[1] (seed 1): model.family=gpt2"),
    ((*HETERO, f"endpoint_models=[{NARROW},{{}},{{}}]"), "endpoint_models[1] (seed 1): hidden_size 16 is larger"),
    ((*HETERO, "endpoint_models=[{},{num_layers:2},{}]"), "endpoint_models[1] (seed 1): model.num_layers=2 differs"),
    ((*HETERO, "endpoint_models=[{},{patch_size:2},{}]"), "endpoint_models[1] (seed 1): model.patch_size=2 differs"),
    ((*HETERO, "endpoint_models=[{},{image_size:16},{}]"), "endpoint_models[1] (seed 1): model.image_size=16"),
    ((*HETERO, "endpoint_models=[{},{layer_norm_eps:1e-5},{}]"), "(seed 1): model.layer_norm_eps=1e-05 differs"),
    ((*TEXT, *HETERO, "endpoint_models=[{},{vocab_size:100},{}]"), "(seed 1): model.vocab_size=100 differs"),
    ((*HETERO, "endpoint_models=[{},{hidden_sise:8},{}]"), "endpoint_models[1] (seed 1): Key 'hidden_sise'"),
    ((*HETERO, "endpoint_models=[{}]"), "endpoint_models has 1 entries for 3 seeds"),
    (("seeds=[0,1]", "pairing=first", "endpoint_models=[{},{hidden_size:8}]"), "vanilla interpolates the original"),
    ((*UNIVERSE, "endpoint_models=[{},{},{}]"), "pairing=universe needs endpoints of one shape"),
    # 4. merges
    (("merge=regmean", "merge.batches=0"), "merge.batches=0: use at least 1"),
    (("merge=regmean", "merge.regmean_alpha=-0.1"), "merge.regmean_alpha=-0.1: use a value in [0, 1]"),
    (("merge=regmean", "merge.regmean_alpha=1.5"), "merge.regmean_alpha=1.5: use a value in [0, 1]"),
    # 5. held-out shares
    (("data.val_fraction=1",), "data.val_fraction=1.0: use a value in [0, 1)"),
    (("data.val_fraction=-0.1",), "data.val_fraction=-0.1: use a value in [0, 1)"),
    ((*TEXT, "data.val_fraction=0"), "data.val_fraction=0.0: data=pydoc cuts a validation block"),
    (("data.test_fraction=0",), "data.test_fraction=0.0: use a value in (0, 1)"),
    (("data.test_fraction=1",), "data.test_fraction=1.0: use a value in (0, 1)"),
    (("data.val_fraction=0.5", "data.test_fraction=0.5"), "data.val_fraction=0.5 and data.test_fraction=0.5"),
    # 6. seeds numpy, sklearn and Lightning accept
    (("seeds=[0,4294967296]",), "seeds=[0, 4294967296]: seed 4294967296 is too large"),
    (("matcher.methods=[learned]", "matcher.learned.seed=4294967296"), "matcher.learned.seed=4294967296"),
    (("multi.seed=4294967296",), "multi.seed=4294967296: use a seed in [0, 2^32)"),
    (("data.split_seed=-1",), "data.split_seed=-1: use a seed in [0, 2^32)"),
    # 8. learning rates and other numbers that must be finite
    (("train.lr=inf",), "train.lr=inf: the learning rate must be positive and finite"),
    (("matcher.methods=[learned]", "matcher.learned.lr=inf"), "matcher.learned.lr=inf: the learning rate must"),
    (("matcher.methods=[learned]", "matcher.learned.lr=nan"), "matcher.learned.lr=nan: the learning rate must"),
    ((*UNIVERSE, "multi.lr=inf"), "multi.lr=inf: the learning rate must be positive and finite"),
    (("train.gradient_clip_val=nan",), "train.gradient_clip_val=nan: use a finite number >= 0"),
    (("model.layer_norm_eps=inf",), "model.layer_norm_eps=inf: use a finite number > 0"),
    (("matcher.methods=[weight]", "matcher.weight.tol=nan"), "matcher.weight.tol=nan: use a finite number >= 0"),
    # 9. keys nothing reads, in every section
    (("+multi.stepp=0.2",), "multi.stepp: not a setting of multi (known: candidates,"),
    (("+matcher.learned.lrr=1",), "matcher.learned.lrr: not a setting of matcher.learned (known: _target_,"),
    (("+matcher.weight_perm.max_iters=3",), "matcher.weight_perm.max_iters: not a setting of matcher.weight_perm"),
    (("+matcher.wieght.lr=1",), "matcher.wieght: not a setting of matcher (known: activation,"),
    (("+trainer.devicez=2",), "trainer.devicez: not a setting of trainer (known: _target_, accelerator,"),
    (("+logger.projet=x",), "logger.projet: not a setting of logger"),
    (("+sed=1",), "sed: not a setting of the config (known: cache_dir,"),
    # 10. the task against the data: masked LM, the topic task and its datasets
    (("data=pydoc_mlm", "model=gpt2_text", "data.tokenizer=char"), "data.tokenizer=char: data.task=masked_lm needs"),
    (("data=pydoc_mlm", "model=gpt2_text", "data.mask_prob=0"), "data.mask_prob=0.0: use a share in (0, 1)"),
    (("data=pydoc_mlm", "model=gpt2_text", "data.mask_seed=-1"), "data.mask_seed=-1: use a seed in [0, 2^32)"),
    (("data=pydoc_mlm", "model=gpt2_text", "data.tokenizer_vocab=0"), "data.tokenizer_vocab=0: use at least 1"),
    (("data=bookcorpus", "model=gpt2_text", "data.task=masked_lm"), "data.task=masked_lm: data=bookcorpus has no"),
    (("data=pydoc_topics", "model=gpt2_text"), "model.num_labels=10: data=pydoc_topics has 4 labels"),
    (("data=pydoc_topics", "data.subset=3"), "data.subset=3: pick one of the data.num_subsets=3 datasets"),
    (("data=pydoc_topics", "data.num_subsets=14"), "data.num_subsets=14: use 1 to 13"),
    (("data=pydoc_topics", "data.task=causal_lm"), "data.task=causal_lm: data=pydoc_topics is a classification"),
]


@pytest.mark.parametrize("overrides, message", CASES, ids=[" ".join(o) for o, _ in CASES])
def test_setting_is_refused_before_any_work_naming_the_key(overrides, message):
    print(f"\n  {refused(overrides, message)}")


def test_valid_settings_still_pass():
    validate_config(compose_config("debug=fast", "data.val_fraction=0"))  # digits: no validation split
    validate_config(compose_config("debug=fast", "+trainer.detect_anomaly=true"))  # a Trainer argument
    validate_config(compose_config("debug=fast", *UNIVERSE, "multi.step=0.25", "multi.samples=0"))
    validate_config(compose_config("debug=fast", *TEXT, "data.seq_len=128"))
    validate_config(compose_config("debug=fast", *HETERO, f"endpoint_models=[{{}},{NARROW},{{}}]"))


def test_every_problem_is_listed_with_its_key():
    message = refused(("+multi.stepp=0.2", "multi.lr=nan", "merge.batches=0", "seeds=[0,4294967296]"), "multi.lr")
    assert [line.split(":")[0].split("=")[0].strip() for line in message.splitlines()[1:]] == [
        "seeds",
        "merge.batches",
        "multi.lr",
        "multi.stepp",
    ]


def test_wrong_endpoint_order_fails_before_training(tmp_path, tiny_overrides):
    cfg = compose_config(*tiny_overrides, *HETERO, f"endpoint_models=[{NARROW},{{}},{{}}]")
    with pytest.raises(ConfigError, match=re.escape("put the widest model first")):
        run_pipeline(cfg, tmp_path / "run")
    assert not (tmp_path / "endpoints").exists() and not (tmp_path / "run").exists()


# 7. the run folder


def test_run_folder_that_cannot_be_created_fails_at_start(tmp_path, tiny_overrides):
    (tmp_path / "file").write_text("not a folder")
    run_dir = tmp_path / "file" / "run"
    with pytest.raises(PermissionError, match=re.escape(f"the run folder {run_dir} cannot be created")) as err:
        run_pipeline(compose_config(*tiny_overrides), run_dir)
    print(f"\n  {err.value}")
    assert not (tmp_path / "endpoints").exists()


def test_read_only_run_folder_fails_at_start(tmp_path, tiny_overrides, monkeypatch):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    make_read_only(monkeypatch, run_dir)
    with pytest.raises(PermissionError, match=re.escape(f"the run folder {run_dir} is not writable")):
        run_pipeline(compose_config(*tiny_overrides), run_dir)
    assert not (tmp_path / "endpoints").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_run_folder_by_its_mode(tmp_path, tiny_overrides):
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o500)
    try:
        with pytest.raises(PermissionError, match=re.escape(str(run_dir))):
            check_run_dir(compose_config(*tiny_overrides), run_dir)
    finally:
        run_dir.chmod(0o700)


# 10. overwrite=true leaves nothing of the replaced results


def test_overwrite_removes_what_the_replaced_config_wrote(tmp_path, tiny_overrides):
    run_dir = tmp_path / "run"
    first = run_pipeline(compose_config(*tiny_overrides, "matcher.methods=[vanilla]", "merge.export=true"), run_dir)
    export = run_dir / "vanilla" / "hf_0-1"
    assert first["methods"]["vanilla"]["pairs"][0]["export"]["exported"] and export.is_dir()
    (run_dir / "notes.txt").write_text("kept")

    second = compose_config(*tiny_overrides, "matcher.methods=[weight]", "overwrite=true")
    run_pipeline(second, run_dir)
    assert not (run_dir / "vanilla").exists()  # the export, and everything else of vanilla's, is gone
    assert list(json.loads((run_dir / "results.json").read_text())["methods"]) == ["weight"]
    assert (run_dir / "weight").is_dir() and (run_dir / "notes.txt").read_text() == "kept"


# 11. the Python API checks what it is given


def _digits(labels: torch.Tensor) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(len(labels), 1, 8, 8, generator=g), labels), batch_size=8)


def test_align_refuses_a_matcher_without_match():
    with pytest.raises(ValueError, match="has no match\\(a, b, context\\) method"):
        align(tiny_vit(0), tiny_vit(1), matcher=object())


def test_labels_outside_the_classes_are_named():
    labels = torch.arange(16) % 12  # 10 classes: labels 10 and 11 do not exist
    trainer = {"accelerator": "cpu", "enable_progress_bar": False}
    with pytest.raises(ValueError, match="label 10 is outside the model's 10 classes") as err:
        align(tiny_vit(0), tiny_vit(1), "learned", data=_digits(labels), trainer=trainer, max_steps=1)
    print(f"\n  {err.value}")
    with pytest.raises(ValueError, match="label 10 is outside the model's 10 classes"):
        evaluate(tiny_vit(0), _digits(labels))


def test_inputs_longer_than_the_positions_are_named():
    a, b = tiny_gpt2(0), tiny_gpt2(1)  # 16 positions
    tokens = torch.randint(0, 97, (2, 20), generator=torch.Generator().manual_seed(0))
    message = "inputs of 20 tokens are longer than the model's 16 positions"
    with pytest.raises(ValueError, match=message) as err:
        evaluate_path(a, b, [(tokens, tokens)], [0.0, 1.0], "causal_lm", progress=False)
    print(f"\n  {err.value}")
    with pytest.raises(ValueError, match=message):
        align(a, b, "activation", data=[(tokens, tokens)])
    with pytest.raises(ValueError, match="input token id 97 is outside the model's vocabulary of 97 ids"):
        evaluate(a, [(torch.full((2, 8), 97), torch.zeros(2, 8, dtype=torch.long))], "causal_lm")


def test_a_matcher_class_that_moved_module_is_the_same_config():
    """A results.json written before glmc.matching.canonical became glmc.matching.unaligned names its
    class by the old path: a rerun with the same settings is the same config (it may resume there)."""
    node = lambda target: {"endpoints": {"source": "trained"}, "matcher": {"canonical": {"_target_": target}}}
    new = node("glmc.matching.unaligned.CanonicalMatcher")
    assert config_differences(node("glmc.matching.canonical.CanonicalMatcher"), new) == []
    assert config_differences(node("my.own.Matcher"), new) == [
        'matcher.canonical._target_: "my.own.Matcher" -> "glmc.matching.unaligned.CanonicalMatcher"'
    ]
