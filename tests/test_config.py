"""Every config composes and instantiates; bad overrides fail before any work, naming the key."""

from __future__ import annotations

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf.errors import OmegaConfBaseException

from glmc.data.module import DataModule
from glmc.matching.registry import build_matcher, method_config
from glmc.models.build import build_model

from conftest import CONF, compose_config

EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
GROUP_OPTIONS = [
    (group, p.stem)
    for group in ("model", "data", "symmetry", "matcher", "trainer", "logger", "debug", "sweep")
    for p in sorted((CONF / group).glob("*.yaml"))
]


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiment_composes_and_instantiates(experiment):
    cfg = compose_config(f"experiment={experiment}")
    assert cfg.experiment == experiment
    model = build_model(cfg.model)
    assert sum(p.numel() for p in model.parameters()) > 0
    assert model.config.num_hidden_layers == cfg.model.num_layers
    DataModule(cfg.data, seed=0)  # built, not set up: real datasets are not on this machine
    for name in cfg.matcher.methods:
        assert build_matcher(method_config(cfg, name)).name == name


@pytest.mark.parametrize("group,option", GROUP_OPTIONS)
def test_every_group_option_composes(group, option):
    cfg = compose_config(f"{group}={option}")
    assert cfg.seeds is not None


def test_paper_scale_vit_matches_table_3():
    cfg = compose_config("experiment=cifar10_vit")
    m = cfg.model
    assert (m.num_layers, m.num_heads, m.hidden_size, m.mlp_size, m.patch_size) == (6, 8, 256, 512, 4)
    cfg = compose_config("experiment=tiny_imagenet_vit")
    m = cfg.model
    assert (m.num_layers, m.num_heads, m.hidden_size, m.mlp_size, m.patch_size) == (8, 8, 384, 768, 8)


def test_misspelled_key_names_the_key():
    with pytest.raises(ConfigCompositionException) as err:
        compose_config("model.hiden_size=32")
    assert "hiden_size" in str(err.value) + str(err.value.__cause__)


def test_wrong_type_names_the_key():
    with pytest.raises((ConfigCompositionException, OmegaConfBaseException)) as err:
        compose_config("train.max_epochs=many")
    assert "max_epochs" in str(err.value) + str(err.value.__cause__)


def test_cli_rejects_bad_override_before_work(tmp_path, monkeypatch, capsys):
    from conftest import run_script

    code, _, err = run_script(monkeypatch, capsys, "trainer.devicez=2", f"hydra.run.dir={tmp_path / 'run'}")
    assert code != 0
    assert "devicez" in err
    assert not (tmp_path / "run" / "results.json").exists()


@pytest.mark.parametrize(
    "override,key",
    [
        ("symmetry.residual=orthogonl", "residual"),
        ("logger=wandb", None),
        ("data.task=regression", "task"),
        ("pairing=some", "pairing"),
    ],
)
def test_misspelled_choice_names_the_key(override, key):
    if key is None:  # a valid choice composes
        assert compose_config(override).logger.kind == "wandb"
        return
    with pytest.raises((ConfigCompositionException, OmegaConfBaseException)) as err:
        compose_config(override)
    assert key in str(err.value) + str(err.value.__cause__)


def test_any_trainer_argument_reaches_the_trainer():
    from glmc.train.trainer import trainer_factory

    cfg = compose_config("debug=fast", "+trainer.detect_anomaly=true", "trainer.log_every_n_steps=3")
    trainer = trainer_factory(cfg.trainer)(logger=False)
    assert trainer._detect_anomaly and trainer.log_every_n_steps == 3


def test_paper_scale_gpt2_matches_table_3():
    cfg = compose_config("experiment=shakespeare_gpt2")
    m = cfg.model
    assert (m.num_layers, m.num_heads, m.hidden_size, m.mlp_size, m.max_positions) == (6, 4, 256, 1024, 256)
    assert (cfg.data.seq_len, cfg.data.batch_size, cfg.train.early_stopping_patience) == (256, 32, 5)
    assert cfg.train.weight_decay == 0.01 and cfg.data.tokenizer == "gpt2" and m.vocab_size == 50257
    cfg = compose_config("experiment=bookcorpus_gpt2")
    m = cfg.model
    assert (m.num_layers, m.num_heads, m.hidden_size, m.mlp_size, m.max_positions) == (6, 8, 512, 2048, 512)
    assert cfg.trainer.devices * cfg.data.batch_size == 64 and cfg.trainer.precision == "16-mixed"
    assert (cfg.train.max_epochs, cfg.train.warmup_fraction, cfg.data.seq_len) == (5, 0.05, 512)
