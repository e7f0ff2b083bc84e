"""A diverging learned-matching run stops cleanly and returns its start, with a warning naming the lr.

Divergence is forced three ways: an lr so large that the latents overflow, a NaN loss, and a
projection that fails (as an SVD of latents near overflow does). Each run ends without an exception
and returns the start transform (weight matching's, or the universe alignment for the refinement).
"""

from __future__ import annotations

import logging

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import glmc.matching.learned_module as learned_module
from glmc.eval.evaluator import path_losses
from glmc.matching.base import MatchContext
from glmc.matching.learned import LearnedMatcher
from glmc.matching.learned_module import LearnedMatchingModule
from glmc.matching.universe import universe_match
from glmc.matching.universe_learned import learned_universe
from glmc.matching.weight import WeightMatcher
from glmc.models import to_canonical
from glmc.symmetry import Orthogonal, SymmetrySpec, apply
from glmc.train.latent_fit import fit_latents
from glmc.train.trainer import trainer_factory

from conftest import compose_config
from tiny_hf import tiny_vit

TINY = dict(hidden=16, heads=2, mlp=32)
STEPS = 4


@pytest.fixture(scope="module")
def pair():
    return to_canonical(tiny_vit(0, **TINY)), to_canonical(tiny_vit(1, **TINY))


def context(run_dir):
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(32, 1, 8, 8, generator=g), torch.randint(0, 10, (32,), generator=g))
    trainer = trainer_factory(compose_config("debug=fast", "logger=none").trainer)
    loader = DataLoader(data, batch_size=16)
    return MatchContext(data=loader, trainer=trainer, run_dir=run_dir, fit=fit_latents, path_loss=path_losses)


def dense(g) -> torch.Tensor:
    return g.matrix if isinstance(g, Orthogonal) else g.dense()


def same_transform(t, u) -> bool:
    return t.keys() == u.keys() and all(torch.equal(dense(t[n]), dense(u[n])) for n in t)


def diverged_match(pair, run_dir, caplog, lr: float = 0.01):
    a, b = pair
    matcher = LearnedMatcher(max_steps=STEPS, lr=lr, checkpoint_every=1)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="glmc"):
        alignment = matcher.match(a, b, context(run_dir))
    start, _ = matcher.initial_transform(a, b, SymmetrySpec.from_model(b))
    assert same_transform(alignment.transform, start)
    # the returned model is B moved by the start: B's function, weight matching's path
    expected = apply(start, b).params()
    assert all(torch.equal(alignment.model.params()[k], v) for k, v in expected.items())
    d = alignment.diagnostics
    assert d["kept_start"] is True and d["diverged"] is True and d["endpoint_deviation"] < 1e-4
    (message,) = [r.getMessage() for r in caplog.records if "diverged" in r.getMessage()]
    print(f"\n  {message}")
    assert message.startswith(f"matcher.learned diverged at step {d['diverged_at']} (lr={lr:g}; ")
    assert message.endswith("): kept the weight-matching start; lower matcher.learned.lr")
    return alignment


def test_huge_lr_keeps_the_start_and_a_rerun_resumes_to_the_same(tmp_path, pair, caplog):
    alignment = diverged_match(pair, tmp_path, caplog, lr=1e30)
    d = alignment.diagnostics
    assert "NaN/inf values" in d["divergence"] and d["steps"] == d["diverged_at"] + 1 < STEPS
    # the rerun resumes the diverged checkpoint, stops before its first step and keeps the start again
    again = diverged_match(pair, tmp_path, caplog, lr=1e30)
    assert again.diagnostics["resumed_from"] == d["checkpoint"]
    assert again.diagnostics["diverged_at"] == d["diverged_at"] and again.diagnostics["steps"] == d["steps"]


def test_nan_loss_stops_at_its_step(tmp_path, pair, caplog, monkeypatch):
    original = LearnedMatchingModule.loss

    def nan_at_step_2(self, inputs, targets, lam, *built):
        loss = original(self, inputs, targets, lam, *built)
        return loss * float("nan") if self.global_step == 2 else loss

    monkeypatch.setattr(LearnedMatchingModule, "loss", nan_at_step_2)
    d = diverged_match(pair, tmp_path, caplog).diagnostics
    assert d["diverged_at"] == 2 and d["divergence"] == "the loss is nan" and d["steps"] == 3
    assert d["loss_history"][2] is None and None not in d["loss_history"][:2]  # strict JSON: NaN as null


def test_failed_projection_stops_at_its_step(tmp_path, pair, caplog, monkeypatch):
    original, calls = learned_module.polar, []

    def failing_polar(z):
        calls.append(1)
        if len(calls) > 2:  # the third training step
            raise torch.linalg.LinAlgError("linalg.svd: The algorithm failed to converge")
        return original(z)

    monkeypatch.setattr(learned_module, "polar", failing_polar)
    d = diverged_match(pair, tmp_path, caplog).diagnostics
    assert d["diverged_at"] == 2 and "the projection of the latents failed (LinAlgError" in d["divergence"]


def test_universe_refinement_keeps_the_universe_alignment(tmp_path, caplog):
    models = [to_canonical(tiny_vit(s, **TINY)) for s in range(3)]
    aligned = universe_match(models, WeightMatcher(), max_rounds=1)
    with caplog.at_level(logging.WARNING, logger="glmc"):
        result = learned_universe(aligned, context(tmp_path), max_steps=STEPS, lr=1e30, checkpoint_every=1)
    d = result.diagnostics
    assert d["diverged"] is True and d["kept_start"] is True
    for before, after in zip(aligned.models, result.models):
        assert all(torch.equal(after.params()[k], v) for k, v in before.params().items())
    (message,) = [r.getMessage() for r in caplog.records if "diverged" in r.getMessage()]
    print(f"\n  {message}")
    assert message.startswith(f"universe.learned diverged at step {d['diverged_at']} (lr=1e+30; ")
    assert message.endswith("kept the universe alignment; lower universe.learned.lr")
