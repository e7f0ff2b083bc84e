"""endpoints=spawn: a parent trained once along its trajectory, its state kept at each step k of
endpoints.steps, and children continued from it with their own data order to the parent's budget."""

from __future__ import annotations

import pytest
import torch

from glmc.config import EndpointsConfig
from glmc.data.module import DataModule
from glmc.eval.evaluator import Evaluator
from glmc.models.build import build_model
from glmc.pipeline import children as spawning
from glmc.pipeline.cache import EndpointCache
from glmc.pipeline.endpoints import cache_key
from glmc.ranges import check_settings
from glmc.train.endpoint import EndpointModule

from conftest import compose_config

STEPS = [0, 1, 4]  # 2 epochs of 2 batches: a budget of 4 optimizer steps (the parent: seed_fixed=5)


class NoTracker:
    def lightning_logger(self, name, job_type):
        return False


def _config(cache):
    return compose_config(
        "debug=fast",
        "endpoints=spawn",
        f"endpoints.steps=[{','.join(map(str, STEPS))}]",
        "seeds=[1,5]",
        "seed_fixed=5",
        "data.limit_train=128",
        f"cache_dir={cache}",
    )


@pytest.fixture(scope="module")
def spawned(tmp_path_factory):
    """The children of two runs of one config, and how often the parent trained in each."""
    folder = tmp_path_factory.mktemp("spawn")
    cfg = _config(folder / "cache")
    data = DataModule(cfg.data)
    data.setup()
    evaluator = Evaluator(list(data.test_dataloader()), progress=False)
    trained, real = [], spawning.train_endpoint

    def counted(*args, **kwargs):
        trained.append(args[1])
        return real(*args, **kwargs)

    runs = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(spawning, "train_endpoint", counted)
        for _ in range(2):
            runs.append((spawning.get_spawned(cfg, folder / "run", NoTracker(), evaluator), len(trained)))
    return cfg, runs


def _params(model):
    return {k: v.detach() for k, v in model.state_dict().items()}


def test_the_parent_trains_once_for_every_step_and_a_rerun_trains_nothing(spawned):
    cfg, [(first, parent_runs), (again, parent_runs_after)] = spawned
    assert parent_runs == 1 and parent_runs_after == 1  # the parent's states at 0, 1 and 4 from one training
    cache, key = EndpointCache(cfg.cache_dir), cache_key(cfg)
    assert all(cache.has({**key, "spawn_point": k}, 5) for k in STEPS)
    assert sorted(first) == STEPS and all(not e.cached for g in first.values() for e in g.values())
    assert all(e.cached for g in again.values() for e in g.values())


def test_children_at_the_whole_budget_are_the_parent(spawned):
    cfg, [(groups, _), _] = spawned
    points = spawning.spawn_points(cfg, cache_key(cfg), cfg.cache_dir, NoTracker())
    assert points[4].total == 4 and points[4].step == 4
    parent = _params(points[4].model)
    for child in groups[4].values():
        assert all(torch.equal(parent[k], v) for k, v in _params(child.model).items())


def test_a_child_with_the_parents_data_order_goes_on_as_the_parent_did(spawned):
    """Weights, AdamW's moments, the schedule and the position in the data order all continue from k."""
    cfg, [(groups, _), _] = spawned
    parent = _params(spawning.spawn_points(cfg, cache_key(cfg), cfg.cache_dir, NoTracker())[4].model)
    for k in (0, 1):
        assert all(torch.equal(parent[name], v) for name, v in _params(groups[k][5].model).items())
    assert any(not torch.equal(parent[name], v) for name, v in _params(groups[1][1].model).items())


def test_children_at_step_0_share_the_initialisation_and_differ_by_their_data_order(spawned):
    cfg, [(groups, _), _] = spawned
    points = spawning.spawn_points(cfg, cache_key(cfg), cfg.cache_dir, NoTracker())
    torch.manual_seed(5)
    init = _params(build_model(cfg.model))  # seed_fixed's initialisation
    assert all(torch.equal(init[k], v) for k, v in _params(points[0].model).items())
    a, b = (_params(e.model) for e in groups[0].values())
    assert any(not torch.equal(a[k], b[k]) for k in a)
    # the children at step 1 continued the parent's state there: they differ from those at step 0
    c = _params(groups[1][1].model)
    assert any(not torch.equal(a[k], c[k]) for k in a)


def test_bad_spawn_steps_are_refused_by_name(tmp_path):
    for bad in ([-1], [10, 0], [0, 0]):
        with pytest.raises(ValueError, match=r"^endpoints.steps=\[.*\]: use optimizer steps >= 0 in increasing"):
            check_settings(EndpointsConfig, "endpoints", {"steps": bad})
    cfg = _config(tmp_path)
    problems = spawning.spawn_problems(cfg, spawning.training_budget(cfg))
    assert problems == []
    cfg.endpoints.steps = [0, 5]
    [beyond] = spawning.spawn_problems(cfg, spawning.training_budget(cfg))
    assert beyond.startswith("endpoints.steps=[0, 5]: step 5 is beyond the parent's budget of 4 optimizer steps")


def test_a_child_starts_from_the_parents_optimizer_moments_and_schedule_position(spawned):
    cfg, _ = spawned
    point = spawning.spawn_points(cfg, cache_key(cfg), cfg.cache_dir, NoTracker())[1]
    module = EndpointModule(point.model, cfg.train, cfg.data.task, point)
    configured = module.configure_optimizers()
    optimizer, scheduler = configured["optimizer"], configured["lr_scheduler"]["scheduler"]
    first = next(iter(point.model.parameters()))
    assert point.moments(0)["exp_avg_sq"].abs().sum() > 0  # the parent's state after one step
    assert torch.equal(optimizer.state[first]["exp_avg"], point.moments(0)["exp_avg"])
    assert float(optimizer.state[first]["step"]) == 1 and scheduler.last_epoch == 1
    factor = scheduler.lr_lambdas[0]  # warmup_cosine over the parent's 4 steps, as the parent's was
    assert optimizer.param_groups[0]["lr"] == cfg.train.lr * factor(1)
