"""A learned-matching run killed at any step resumes to the numbers of an uninterrupted run: the
training order is a function of the step (glmc.data.step_sampler), so a mid-epoch last.ckpt is a
complete state."""

from __future__ import annotations

import shutil

import torch
from lightning.pytorch.callbacks import Callback

from glmc.data.module import DataModule
from glmc.data.step_sampler import StepSampler
from glmc.eval.evaluator import path_losses
from glmc.matching.base import MatchContext
from glmc.matching.learned import LearnedMatcher
from glmc.models.convert import to_canonical
from glmc.train.latent_fit import FitClock, fit_latents
from glmc.train.trainer import trainer_factory

from conftest import compose_config
from tiny_hf import tiny_vit


def _batches(sampler: StepSampler, epochs: int) -> list[list[int]]:
    out = []
    for _ in range(epochs):
        order = list(sampler)
        out += [order[i : i + sampler.batch_size] for i in range(0, len(order), sampler.batch_size)]
    return out


def test_a_sampler_started_at_a_step_continues_the_uninterrupted_order():
    whole = _batches(StepSampler(10, seed=3, batch_size=3, drop_last=True), epochs=3)
    assert len(whole) == 9 and all(len(b) == 3 for b in whole)
    assert sorted(sum(whole[:3], [])) != sorted(range(10))  # drop_last leaves one example out per epoch
    assert whole[:3] != whole[3:6]  # every epoch is shuffled anew
    for start in range(9):
        resumed = StepSampler(10, seed=3, batch_size=3, drop_last=True, start_step=start)
        assert _batches(resumed, epochs=3)[: 9 - start] == whole[start:]
    # an iterator made and dropped unused moves nothing
    sampler = StepSampler(10, seed=3, batch_size=3, drop_last=False, start_step=2)
    iter(sampler)
    assert list(sampler)[:3] == StepSampler(10, 3, 3, False).epoch_order(0)[6:9]


class _KillSnapshot(Callback):
    """The checkpoint folder as a kill -9 at `step` would leave it."""

    def __init__(self, step, folder, snapshot):
        self.step, self.folder, self.snapshot = step, folder, snapshot

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == self.step and not self.snapshot.exists():
            shutil.copytree(self.folder, self.snapshot)


def test_a_learned_run_killed_mid_epoch_resumes_to_the_uninterrupted_numbers(tmp_path):
    cfg = compose_config("debug=fast")  # 256 training digits in batches of 64: four steps per epoch
    data = DataModule(cfg.data, seed=0)
    data.setup()
    a = to_canonical(tiny_vit(seed=0, hidden=16, mlp=32, layers=1))
    b = to_canonical(tiny_vit(seed=1, hidden=16, mlp=32, layers=1))
    make = trainer_factory(cfg.trainer)

    def run(folder, extra=()):
        trainer = lambda **kw: make(**{**kw, "callbacks": kw["callbacks"] + list(extra)})
        matcher = LearnedMatcher(max_steps=10, checkpoint_every=3, lr=0.05, lambda_scheme="uniform")
        context = MatchContext(data=data, trainer=trainer, run_dir=folder, fit=fit_latents, path_loss=path_losses)
        return matcher.match(a, b, context)

    uninterrupted = run(tmp_path / "whole")
    # a second run is killed at step 6: mid-epoch, after last.ckpt of step 3 and the epoch end at step 4
    killed = tmp_path / "killed"
    run(killed, [_KillSnapshot(6, killed, tmp_path / "at_kill")])
    shutil.rmtree(killed)
    shutil.copytree(tmp_path / "at_kill", killed)
    resumed = run(killed)

    assert resumed.diagnostics["resumed_from"] and resumed.diagnostics["resumed_from"].endswith("last.ckpt")
    for key in ("loss_history", "lambda_history"):
        assert resumed.diagnostics[key] == uninterrupted.diagnostics[key]  # number for number
    assert resumed.diagnostics["steps"] == 10
    for name, g in uninterrupted.transform.items():
        other = resumed.transform[name]
        assert torch.equal(
            getattr(g, "matrix", getattr(g, "perm", None)), getattr(other, "matrix", getattr(other, "perm", None))
        )
    # the resumed run counts the fit seconds of the attempt before its checkpoint; a fresh run counts none
    assert uninterrupted.diagnostics["seconds_before_resume"] == 0.0
    assert resumed.diagnostics["seconds_before_resume"] > 0.0


def test_the_fit_clock_carries_the_seconds_of_earlier_attempts():
    clock = FitClock()
    clock.load_state_dict({"seconds": 12.5})  # what a checkpoint of an earlier attempt holds
    clock.on_train_start(None, None)
    assert clock.earlier == 12.5
    assert clock.state_dict()["seconds"] >= 12.5  # the next checkpoint adds this attempt's seconds
    assert FitClock().state_dict()["seconds"] < 12.5
