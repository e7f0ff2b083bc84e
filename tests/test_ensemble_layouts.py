"""benchmarks/ensemble_layouts.py compares like with like: its plain steps and its stacked step train the same
models on the same batches, so one step of each leaves the same weights (within the round-off of products
taken batched, the bound of tests/test_ensemble.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from conftest import compose_config

pytestmark = pytest.mark.numeric  # one step taken stacked and one after another: floats computed two ways
BOUND = 5e-4  # relative to the tensor's largest entry


def _benchmark():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "ensemble_layouts.py"
    spec = importlib.util.spec_from_file_location("ensemble_layouts", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_layouts_time_the_same_models_stepped_alike(one_thread):
    bench = _benchmark()
    cfg = compose_config("debug=fast", "logger=none")
    plain, models = bench.plain_steps(cfg, 2, seed=3)
    stacked, module = bench.stacked_step(cfg, 2, seed=3)
    before = [module.member_state(k) for k in range(len(models))]
    for model, state in zip(models, before):  # the same initial weights
        assert all(torch.equal(state[name], p) for name, p in model.named_parameters())
    plain()
    stacked()
    for k, model in enumerate(models):
        state = module.member_state(k)
        for name, p in model.named_parameters():
            gap = float((p.detach() - state[name]).abs().max())
            moved = float((p.detach() - before[k][name]).abs().max())
            assert moved > 0, (k, name)  # the step changed it
            assert gap <= BOUND * float(p.detach().abs().max()) and gap < 0.01 * moved, (k, name, gap, moved)
