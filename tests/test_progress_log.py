"""Without a terminal, training progress is written as log lines: step, loss, steps/s, time left."""

from __future__ import annotations

import io
import logging
import re
import sys

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from glmc.eval.evaluator import path_losses
from glmc.matching.base import MatchContext
from glmc.matching.learned import LearnedMatcher
from glmc.models import to_canonical
from glmc.train.divergence import DivergenceGuard
from glmc.train.latent_fit import fit_latents
from glmc.train.progress_log import ProgressLog, duration
from glmc.train.trainer import trainer_factory

from conftest import compose_config
from tiny_hf import tiny_vit

STEPS = 5


class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        return F.mse_loss(self.layer(inputs), targets)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loader():
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(12, 4, generator=g), torch.randn(12, 1, generator=g)), batch_size=4)


class Stream(io.StringIO):
    def __init__(self, terminal: bool):
        super().__init__()
        self.terminal = terminal

    def isatty(self) -> bool:
        return self.terminal


def fit_lines(tmp_path, caplog, monkeypatch, terminal=False, callbacks=(), *overrides) -> tuple[L.Trainer, list[str]]:
    monkeypatch.setattr(sys, "stdout", Stream(terminal))  # a log file, or a terminal
    make = trainer_factory(compose_config("logger=none", *overrides).trainer)
    trainer = make(
        default_root_dir=str(tmp_path), logger=False, max_steps=STEPS, enable_checkpointing=False, callbacks=callbacks
    )
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="glmc.train.progress_log"):
        trainer.fit(Regression(), train_dataloaders=loader())
    return trainer, [r.getMessage() for r in caplog.records if r.name == "glmc.train.progress_log"]


def test_non_terminal_output_gets_step_loss_rate_and_time_left(tmp_path, caplog, monkeypatch):
    guard = DivergenceGuard("seed 3", "lower train.lr")
    trainer, lines = fit_lines(tmp_path, caplog, monkeypatch, False, [guard])
    assert sum(isinstance(c, ProgressLog) for c in trainer.callbacks) == 1
    assert trainer.progress_bar_callback is None  # the lines replace the bar in a log file
    print("\n  " + "\n  ".join(lines))
    # the first step, the last one (inside 30 s, nothing between) and a summary
    first, last, summary = lines
    number, name = r"[0-9.e+]+", "training seed 3"
    assert re.fullmatch(rf"{name}: step 1/{STEPS} \(epoch 0\), loss {number}, {number} steps/s, \w+ left", first)
    assert re.fullmatch(rf"{name}: step {STEPS}/{STEPS} \(epoch 1\), loss {number}, {number} steps/s, done", last)
    assert re.fullmatch(rf"{name}: {STEPS} steps in \w+ \({number} steps/s\)", summary)


def test_every_steps_writes_a_line_at_each_multiple(tmp_path, caplog, monkeypatch):
    _, lines = fit_lines(tmp_path, caplog, monkeypatch, False, [ProgressLog(every_steps=2, label="run")])
    steps = [int(m.group(1)) for line in lines if (m := re.match(r"run: step (\d+)/", line))]
    assert steps == [1, 2, 4, 5]  # this callback's lines; the factory's own one writes at 1 and 5 only


@pytest.mark.parametrize("terminal, overrides", [(True, ()), (False, ("trainer.enable_progress_bar=false",))])
def test_no_lines_on_a_terminal_or_with_progress_off(tmp_path, caplog, monkeypatch, terminal, overrides):
    trainer, lines = fit_lines(tmp_path, caplog, monkeypatch, terminal, (), *overrides)
    assert lines == [] and not any(isinstance(c, ProgressLog) for c in trainer.callbacks)
    assert (trainer.progress_bar_callback is not None) == terminal  # a terminal keeps its bar


def test_durations_read_as_hours_minutes_seconds():
    assert [duration(s) for s in (0.4, 59, 61, 3599, 3600 * 2 + 7 * 60)] == ["0s", "59s", "1m01s", "59m59s", "2h07m"]


def test_learned_matching_lines_name_the_method(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(sys, "stdout", Stream(False))
    a, b = (to_canonical(tiny_vit(seed, hidden=16, heads=2, mlp=32)) for seed in (0, 1))
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(16, 1, 8, 8, generator=g), torch.randint(0, 10, (16,), generator=g))
    make = trainer_factory(compose_config("logger=none").trainer)
    loader = DataLoader(data, batch_size=8)
    context = MatchContext(data=loader, trainer=make, run_dir=tmp_path, fit=fit_latents, path_loss=path_losses)
    with caplog.at_level(logging.INFO, logger="glmc.train.progress_log"):
        LearnedMatcher(max_steps=3, lr=0.01).match(a, b, context)
    lines = [r.getMessage() for r in caplog.records if r.name == "glmc.train.progress_log"]
    assert lines[0].startswith("matcher.learned: step 1/3 (epoch 0), loss ") and "steps/s" in lines[0]
    assert lines[-1].startswith("matcher.learned: 3 steps in ")
