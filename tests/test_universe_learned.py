"""Learned refinement of universe matching: function preservation, training, resume, fixed model 0."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader, TensorDataset

from glmc.matching.base import MatchContext
from glmc.matching.universe import universe_match
from glmc.matching.universe_learned import (
    UniverseLearnedSettings,
    UniverseLearningModule,
    learned_universe,
    sample_alpha,
)
from glmc.matching.weight import WeightMatcher
from glmc.models import to_canonical
from glmc.symmetry import Orthogonal, Permutation, Transform, apply
from glmc.train.latent_fit import fit_latents
from glmc.train.trainer import trainer_factory

from conftest import compose_config
from numeric import FORWARD, assert_close_rel
from tiny_hf import inputs_for, tiny_vit

TINY = dict(hidden=16, heads=2, mlp=32)
STEPS = 5


@pytest.fixture(scope="module")
def universe():
    originals = [tiny_vit(s, **TINY) for s in range(3)]
    models = [to_canonical(m) for m in originals]
    return originals, models, universe_match(models, WeightMatcher(), max_rounds=2)


def images(n=16, seed=0):
    # one batch per epoch: the data at a step does not depend on where a run restarted
    g = torch.Generator().manual_seed(seed)
    data = TensorDataset(torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g))
    return DataLoader(data, batch_size=n)


def trainer():
    return trainer_factory(compose_config("debug=fast", "logger=none").trainer)


class CountSteps(Callback):
    def __init__(self):
        self.steps = 0

    def on_train_batch_end(self, *args):
        self.steps += 1


def with_callback(make_trainer, callback: Callback):
    def make(callbacks=(), **kwargs):
        return make_trainer(callbacks=[*callbacks, callback], **kwargs)

    return make


def settings(**overrides):
    return UniverseLearnedSettings(**{"max_steps": STEPS, "lr": 0.01, "checkpoint_every": 2, **overrides})


def refine(aligned, run_dir, make_trainer=None, **overrides):
    context = MatchContext(data=images(), trainer=make_trainer or trainer(), run_dir=run_dir, fit=fit_latents)
    return learned_universe(aligned, context, settings(**overrides))


@pytest.mark.numeric
def test_refined_models_preserve_functions_and_model_0_is_fixed(tmp_path, universe):
    originals, models, aligned = universe
    result = refine(aligned, tmp_path / "run")
    x = inputs_for(originals[0])
    for i, (original, model, (u, r), refined) in enumerate(zip(originals, models, result.transforms, result.models)):
        want = original(x).logits
        assert_close_rel(refined(x), want, FORWARD, f"refined model {i}")
        assert_close_rel(apply(r, apply(u, model))(x), want, FORWARD, f"model {i}: both transforms applied")
        assert refined.config.form == "factored"
    assert result.function_preserving and result.circuits == aligned.circuits == ("qk", "vo")

    # model 0: no refinement, the very same model
    assert result.transforms[0][1] == Transform() and result.models[0] is aligned.models[0]
    for i in (1, 2):
        r = result.transforms[i][1]
        assert set(r) == set(aligned.transforms[i])
        assert isinstance(r["residual"], Orthogonal) and isinstance(r["mlp.0"], Permutation)

    d = result.diagnostics
    assert d["steps"] == STEPS and len(d["history"]) == STEPS
    assert all(math.isfinite(v) for v in d["history"])
    assert d["concentration"] == 1.0 and d["seconds"] > 0 and d["resumed_from"] is None
    assert len(d["alpha_history"]) == STEPS
    for step, alpha in enumerate(d["alpha_history"]):
        assert alpha == pytest.approx(sample_alpha(3, 1.0, 0, step), rel=1e-6)
    assert len(d["changed_from_universe"]) == 3 and d["changed_from_universe"][0] == {}


def test_training_lowers_the_loss_on_a_fixed_batch(tmp_path, universe):
    _, _, aligned = universe
    # concentration 1e6: alpha is the centroid at every step, so the losses are comparable
    result = refine(aligned, tmp_path / "run", lr=0.05, warmup_fraction=0.0, concentration=1e6, max_steps=8)
    history = result.diagnostics["history"]
    print(f"\n  centroid loss per step: {[round(v, 4) for v in history]}")
    assert len(history) == 8 and all(math.isfinite(v) for v in history)
    assert min(history[1:]) < history[0]


def test_rerun_resumes_from_the_checkpoint(tmp_path, universe):
    _, _, aligned = universe
    run_dir = tmp_path / "shared"
    first = refine(aligned, run_dir)
    counter = CountSteps()
    again = refine(aligned, run_dir, with_callback(trainer(), counter))
    assert counter.steps == 0
    assert again.diagnostics["resumed_from"] == first.diagnostics["checkpoint"]
    assert again.diagnostics["history"] == first.diagnostics["history"]
    for (_, r1), (_, r2) in zip(first.transforms, again.transforms):
        for space, g in r1.items():
            h = r2[space]
            assert torch.equal(g.perm, h.perm) if isinstance(g, Permutation) else torch.equal(g.matrix, h.matrix)
    # other settings start afresh in their own folder
    other = refine(aligned, run_dir, lr=0.02)
    assert other.diagnostics["resumed_from"] is None
    assert len(list(run_dir.glob("universe_*"))) == 2


class Crash(Exception):
    pass


def test_interrupted_run_continues_where_it_stopped(tmp_path, universe):
    _, _, aligned = universe
    straight = refine(aligned, tmp_path / "straight")

    class CrashAt(Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == 3:
                raise Crash("killed at step 3")

    normal = trainer()
    with pytest.raises(Crash):
        refine(aligned, tmp_path / "resumed", with_callback(normal, CrashAt()))
    counter = CountSteps()
    resumed = refine(aligned, tmp_path / "resumed", with_callback(normal, counter))
    assert counter.steps == STEPS - 3  # the checkpoint written at the crash
    assert resumed.diagnostics["resumed_from"] is not None
    assert resumed.diagnostics["alpha_history"] == straight.diagnostics["alpha_history"]
    assert resumed.diagnostics["history"] == pytest.approx(straight.diagnostics["history"], rel=1e-4)


def test_dirichlet_draws_and_bad_inputs(universe):
    _, models, aligned = universe
    a = sample_alpha(4, 1.0, seed=3, step=7)
    assert a == sample_alpha(4, 1.0, seed=3, step=7) != sample_alpha(4, 1.0, seed=3, step=8)
    assert math.isclose(sum(a), 1.0) and min(a) > 0
    near = np.array([sample_alpha(3, 1e4, 0, s) for s in range(50)])
    assert np.abs(near - 1 / 3).max() < 0.05  # large concentration: near the centroid
    with pytest.raises(ValueError, match="concentration"):
        UniverseLearnedSettings(concentration=0.0)
    with pytest.raises(ValueError, match="edge_share"):
        UniverseLearnedSettings(edge_share=1.5)
    with pytest.raises(ValueError, match="edge_lambda"):
        UniverseLearnedSettings(edge_lambda="beta")
    with pytest.raises(ValueError, match="latent sets"):
        UniverseLearningModule(models, [{}], settings(), "classification")
    with pytest.raises(ValueError, match="not both"):
        learned_universe(aligned, MatchContext(data=images()), settings(), lr=0.1)


def test_edge_share_puts_that_share_of_draws_on_an_edge():
    draws = np.array([sample_alpha(3, 1.0, 0, s, edge_share=0.5) for s in range(400)])
    assert np.allclose(draws.sum(axis=1), 1.0)
    on_edge = (draws == 0).sum(axis=1)
    assert set(on_edge) <= {0, 1}  # exactly two models take part on an edge
    assert 0.4 < on_edge.mean() < 0.6
    edges = {tuple(np.flatnonzero(row == 0)) for row in draws[on_edge == 1]}
    assert edges == {(0,), (1,), (2,)}  # every edge is drawn
    assert not (np.array([sample_alpha(3, 1.0, 0, s) for s in range(50)]) == 0).any()


def test_gaussian_edge_lambda_gathers_edge_draws_around_the_midpoint():
    def edge_weights(scheme):
        draws = np.array([sample_alpha(3, 1.0, 0, s, edge_share=1.0, edge_lambda=scheme) for s in range(400)])
        assert ((draws == 0).sum(axis=1) == 1).all()  # every draw on an edge
        return draws.max(axis=1)  # the larger of the two weights: 0.5 at the midpoint, 1 at a vertex

    gaussian, uniform = edge_weights("gaussian"), edge_weights("uniform")
    assert np.abs(gaussian.mean() - 0.58) < 0.03  # E max(l, 1 - l) for l ~ N(0.5, 0.1): 0.5 + 0.1 * 0.8
    assert np.abs(uniform.mean() - 0.75) < 0.03  # for l ~ U(0, 1)
    assert (gaussian < 0.8).mean() > 0.97 > (uniform < 0.8).mean()


def test_several_candidates_train_at_one_of_the_steps_own_draws(tmp_path, universe):
    _, _, aligned = universe
    result = refine(aligned, tmp_path / "run", candidates=3, max_steps=8)
    chosen = []
    for step, alpha in enumerate(result.diagnostics["alpha_history"]):
        draws = [sample_alpha(3, 1.0, 0, step, draw=d) for d in range(3)]
        matches = [d for d, draw in enumerate(draws) if alpha == pytest.approx(draw, rel=1e-6)]
        assert matches, (step, alpha, draws)
        chosen.append(matches[0])
    print(f"\n  chosen draw per step: {chosen}")
    assert any(d > 0 for d in chosen)  # the worst is not always the first draw: a real choice
    assert sample_alpha(3, 1.0, 0, 5, draw=0) == sample_alpha(3, 1.0, 0, 5) != sample_alpha(3, 1.0, 0, 5, draw=1)
    with pytest.raises(ValueError, match="candidates"):
        UniverseLearnedSettings(candidates=0)
