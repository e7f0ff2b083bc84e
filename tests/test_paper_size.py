"""Paper 001's Table 2 columns at the paper's size: every command docs/reproducing.md gives composes and validates
(nothing runs: the data and a GPU are not here), each config carries the settings of the paper's App. B,
and `experiments/reproduce.py table2 --paper-size` issues exactly those commands."""

from __future__ import annotations

import json
import sys

import pytest

from glmc.data.module import DataModule
from glmc.pipeline.validate import validate_config
from glmc.report import table2
from glmc.train.trainer import trainer_factory

from conftest import ROOT, compose_config

sys.path.insert(0, str(ROOT / "experiments"))
import reproduce  # noqa: E402  (a script, importable once its folder is on the path)

DATA = ("data.root=/data",)
TOKENIZER = ("data.tokenizer_path=/models/gpt2",)
TABLE2_ROWS = ["vanilla", "activation", "weight_perm", "weight", "learned_perm", "learned"]

# column -> (the documented command's overrides, (layers, heads, width, MLP), epochs, examples per step, weight decay,
# warm-up share, early-stopping patience)
COLUMNS = {
    "cifar10": (("experiment=cifar10_vit", "trainer=gpu", *DATA), (6, 8, 256, 512), 150, 128, 0.05, 0.0, None),
    "cifar100": (("experiment=cifar100_vit", "trainer=gpu", *DATA), (6, 8, 256, 512), 150, 128, 0.05, 0.0, None),
    "tiny_imagenet": (
        ("experiment=tiny_imagenet_vit", "trainer=gpu", *DATA),
        (8, 8, 384, 768),
        150,
        128,
        0.01,
        0.05,
        None,
    ),
    "shakespeare": (
        ("experiment=shakespeare_gpt2", "trainer=gpu", *DATA, *TOKENIZER),
        (6, 4, 256, 1024),
        100,
        32,
        0.01,
        0.05,
        5,
    ),
    "bookcorpus": (
        ("experiment=bookcorpus_gpt2", "trainer=ddp_gpu", *DATA, *TOKENIZER),
        (6, 8, 512, 2048),
        5,
        64,
        0.01,
        0.05,
        None,
    ),
    "bookcorpus_one_gpu": (
        ("experiment=bookcorpus_gpt2", "trainer=gpu", "trainer.devices=1", "data.batch_size=64", *DATA, *TOKENIZER),
        (6, 8, 512, 2048),
        5,
        64,
        0.01,
        0.05,
        None,
    ),
}


@pytest.mark.parametrize("column", list(COLUMNS))
def test_paper_size_command_composes_validates_and_matches_appendix_b(column):
    overrides, shape, epochs, batch, decay, warmup, patience = COLUMNS[column]
    cfg = compose_config(*overrides)
    validate_config(cfg)
    DataModule(cfg.data, seed=0)  # built, not set up: the datasets are not on this machine
    assert callable(trainer_factory(cfg.trainer))  # validate_config checked its keys against lightning.Trainer
    m, t = cfg.model, cfg.train
    assert (m.num_layers, m.num_heads, m.hidden_size, m.mlp_size) == shape
    assert (t.max_epochs, t.weight_decay, t.warmup_fraction, t.early_stopping_patience) == (
        epochs,
        decay,
        warmup,
        patience,
    )
    devices = cfg.trainer.devices
    assert cfg.trainer.accelerator == "gpu" and devices * cfg.data.batch_size == batch
    assert list(cfg.matcher.methods) == TABLE2_ROWS and list(cfg.seeds) == [0, 1, 2, 3]
    assert cfg.matcher.learned.lr == 3e-4 and cfg.matcher.learned.lambda_scheme == "uniform_mid"
    if m.family == "gpt2":
        assert cfg.data.tokenizer == "gpt2" and cfg.data.tokenizer_path == "/models/gpt2" and m.vocab_size == 50257
        assert cfg.data.seq_len == m.max_positions == (512 if column.startswith("bookcorpus") else 256)
    if column.startswith("bookcorpus"):  # App. B.2: fp16 mixed precision; DDP over 4 GPUs of 16 examples each
        assert cfg.trainer.precision == "16-mixed"
        assert (cfg.trainer.strategy, devices) == (("ddp_spawn", 4) if column == "bookcorpus" else ("auto", 1))
    else:
        assert (cfg.trainer.strategy, devices, cfg.trainer.precision) == ("auto", 1, "32-true")


def two_pairs(barrier: float) -> list[dict]:
    return [{"seeds": [a, a + 1], "barrier": barrier, "seconds": 1.0} for a in (0, 2)]


def test_reproduce_paper_size_issues_each_column_command(tmp_path, monkeypatch):
    extra = [*DATA, *TOKENIZER]
    args, opts = reproduce.parse(
        [
            "table2",
            "--paper-size",
            "--root",
            str(tmp_path),
            "--out",
            str(tmp_path / "report"),
            *(f"--set={o}" for o in extra),
        ]
    )
    assert opts.paper_size and reproduce.parse(["table2", "--paper-size"])[1].out == ROOT / "report" / "paper_size"
    (artefact,) = reproduce.load_artefacts(args.names, opts.paper_size)
    assert artefact is table2.PAPER_ARTEFACT
    calls = []

    def record(argv, what, folder, env=None):  # run.py's arguments; a finished run leaves results.json
        calls.append(argv)
        folder.mkdir(parents=True, exist_ok=True)
        methods = {"vanilla": {"pairs": two_pairs(1.0)}, "weight": {"pairs": two_pairs(0.25)}}
        (folder / "results.json").write_text(json.dumps({"methods": methods}))
        return 1.0

    monkeypatch.setattr(reproduce, "run_command", record)
    for step in artefact.steps:
        reproduce.run_step(artefact, step, opts)
    columns = ("cifar10", "cifar100", "tiny_imagenet", "shakespeare", "bookcorpus")
    for argv, step, column in zip(calls, artefact.steps, columns, strict=True):
        assert argv == [*step.overrides, *extra, f"hydra.run.dir={tmp_path / step.label}"]
        assert set(COLUMNS[column][0]) <= set(argv)  # the documented command (--set reaches every step)
    files = reproduce.reproduce(artefact, opts)  # the finished steps are skipped; the table is made from them
    section = (opts.out / "table2" / "section.md").read_text()
    assert "`python experiments/reproduce.py table2 --paper-size`" in section and len(files) == 4
    assert "| weight | 0.250 ± 0.000 | 0.25 | 1 | 0.250 ± 0.000 |" in section
    assert all(f"| {task} | × vanilla |" in section for task, _ in table2.PAPER_TASKS)


def test_paper_size_is_table2_only_and_the_default_is_unchanged(capsys):
    with pytest.raises(SystemExit, match="name table2"):
        reproduce.load_artefacts(["fig3"], paper_size=True)
    for flags in (["--tiny"], ["--report"]):
        with pytest.raises(SystemExit):
            reproduce.parse(["table2", "--paper-size", *flags])
    capsys.readouterr()
    args, opts = reproduce.parse(["table2"])
    (artefact,) = reproduce.load_artefacts(args.names, opts.paper_size)
    assert not opts.paper_size and artefact is table2.ARTEFACT and opts.root.name == "reproduce"
    assert [s.label for s in artefact.steps] == ["table2_digits", "table2_text"]
