"""train.ensemble: seeds trained as one batched model are the seeds trained one at a time, within float32
round-off, and are cached as they are; where members cannot be stacked a line says why.

Tolerance: a member's forward and backward run as vmapped (batched) kernels, whose products are summed in
another order than one model's; the round-off (~1e-7 relative per operation) is amplified by every AdamW
step (whose update divides by sqrt of the second moment, so tiny gradients' differences weigh as much as
large ones). Attention on a CPU and experts everywhere are the members' own calls bit for bit
(glmc.train.folded_attention, glmc.train.folded_experts). Measured over these runs' 8 optimizer steps,
the largest gap relative to a tensor's largest entry: 1.7e-6 (digits ViT), 1.9e-5 (text GPT-2, in
c_attn.bias, which holds the key bias), 0 (text Llama), 0 (text Mixtral), 1.9e-6 (masked-LM BERT, whose
training masks each member draws from its own stream), and 4.5e-6 over the up to 16 steps of the
early-stopping members (digits ViT at lr 0.04, each kept epoch's weights), 5.9e-7 over the 3 steps of
spawned children (digits ViT, from the parent's state at step 1); the bound is ~26x the largest. The
separate key biases of the ViT and BERT (k_proj.bias, attention.self.key.bias) are left out: their
gradient is zero in exact arithmetic (a key bias adds one q.b to all of a query's scores, which softmax
ignores), so AdamW turns each run's own round-off into lr-sized steps, and they differ by ~50% while
changing no output."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from glmc.models.build import build_model
from glmc.pipeline import ensemble
from glmc.pipeline.cache import EndpointCache
from glmc.pipeline.endpoints import cache_key, divergence_hint, endpoint_seeds, train_endpoint
from glmc.pipeline.run import run_pipeline

from conftest import compose_config

pytestmark = pytest.mark.numeric  # members against seeds trained alone: floats computed two ways

WEIGHTS_RTOL = 5e-4  # relative to each tensor's largest entry
NO_GRADIENT = ("k_proj.bias", "attention.self.key.bias")  # parameters that no output depends on


class NoTracker:
    def lightning_logger(self, *args):
        return False


def _relative_gap(a: dict, b: dict) -> float:
    names = [n for n in b if not n.endswith(NO_GRADIENT)]
    return max(((a[n] - b[n]).abs().max() / b[n].abs().max().clamp(min=1e-12)).item() for n in names)


def _evaluate(cfg, model) -> float:
    from glmc.data.module import DataModule
    from glmc.eval.evaluator import Evaluator

    data = DataModule(cfg.data, seed=0)
    data.setup()
    return Evaluator(data.test_dataloader(), task=cfg.data.task, progress=False).evaluate(model)[0]


TEXT = ("data=pydoc", "data.limit_train=128", "data.limit_test=32")


@pytest.mark.parametrize(
    "overrides",
    [
        ("debug=fast",),
        ("debug=fast", "model=gpt2_text", *TEXT),
        ("debug=fast", "model=llama_text", *TEXT),
        ("debug=fast", "model=mixtral_text", *TEXT),
        ("debug=fast", "model=bert_tiny", "data=pydoc_mlm", "data.limit_train=128", "data.limit_test=32"),
    ],
    ids=["digits_vit", "text_gpt2", "text_llama", "text_mixtral", "mlm_bert"],
)
def test_a_member_is_the_seed_trained_alone(tmp_path, one_thread, overrides):
    cfg = compose_config(*overrides, "logger=none")
    seeds = [0, 1]
    module = ensemble._fit(cfg, tmp_path, NoTracker(), [endpoint_seeds(cfg, s) for s in seeds], divergence_hint(cfg))
    for k, seed in enumerate(seeds):
        alone, _ = train_endpoint(cfg, seed, tmp_path, logger=False)
        member = build_model(cfg.model)
        ensemble._load_member(member, module.member_state(k))
        want = dict(alone.named_parameters())
        gap = _relative_gap(dict(member.named_parameters()), want)
        print(f"seed {seed}: max relative weight gap {gap:.2e}")
        assert gap < WEIGHTS_RTOL, seed
        assert _evaluate(cfg, member.eval()) == pytest.approx(_evaluate(cfg, alone), abs=1e-4)


RUN = ("debug=fast", "logger=none", "seeds=[0,1]", "pairing=first", "matcher.methods=[vanilla,weight]")


def test_an_ensemble_run_caches_and_measures_what_one_at_a_time_does(tmp_path, one_thread, monkeypatch, caplog):
    one = compose_config(*RUN, f"cache_dir={tmp_path / 'one'}")
    both = compose_config(*RUN, f"cache_dir={tmp_path / 'both'}", "train.ensemble=true")
    key = cache_key(one)
    assert cache_key(both) == key  # how the seeds train is not part of what an endpoint is
    run_pipeline(one, tmp_path / "run_one")

    def no_training_alone(*args, **kwargs):
        raise AssertionError("a seed trained on its own")

    monkeypatch.setattr("glmc.pipeline.endpoints.train_endpoint", no_training_alone)
    with caplog.at_level(logging.INFO):
        together = run_pipeline(both, tmp_path / "run_both")
    assert "seeds [0, 1]: training together as one batched model" in caplog.text
    assert [e["cached"] for e in together["endpoints"]] == [False, False]  # trained by this run
    for seed in (0, 1):
        assert EndpointCache(tmp_path / "both").has(key, seed)
    assert not list((tmp_path / "both").glob("*/.train_ensemble_0_1"))  # its checkpoints: gone once cached
    saved = [json.loads((tmp_path / run / "results.json").read_text()) for run in ("run_one", "run_both")]
    for method in ("vanilla", "weight"):
        assert saved[1]["methods"][method]["barrier"] == pytest.approx(saved[0]["methods"][method]["barrier"], abs=1e-3)
    for alone, member in zip(saved[0]["endpoints"], saved[1]["endpoints"]):
        assert member["test_loss"] == pytest.approx(alone["test_loss"], abs=1e-4)


def test_what_cannot_be_stacked_trains_one_at_a_time_and_says_why(tmp_path, caplog):
    cfg = compose_config(*RUN, "train.ensemble=true", "train.save_steps=2")
    todo = lambda cfg: [(0, 0, {}), (1, 1, {})]  # noqa: E731
    with caplog.at_level(logging.INFO):
        trained = ensemble.train_ensemble(cfg, tmp_path, None, None, todo, endpoint_seeds, "")
    assert trained == set()
    assert "train.ensemble: training one seed at a time, since train.save_steps" in caplog.text


def test_the_benchmark_times_the_ensemble_beside_one_seed_and_the_sequence(capsys, one_thread):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "parallel_seeds.py"
    spec = importlib.util.spec_from_file_location("parallel_seeds", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    tiny = ["debug=fast", "data.limit_train=64", "data.limit_test=32", "train.max_epochs=1"]
    times = bench.main(tiny, 2, None, "cpu", ensemble=True)
    assert set(times) == {"one", "sequential", "ensemble"}
    printed = capsys.readouterr().out
    assert f"ensemble / one seed {times['ensemble'] / times['one']:.2f}" in printed
    assert f"sequential / ensemble {times['sequential'] / times['ensemble']:.2f}" in printed


class Killed(Exception):
    """The run's end, right after an epoch's checkpoint."""


def test_an_interrupted_ensemble_resumes_to_the_uninterrupted_weights(tmp_path, one_thread, monkeypatch, caplog):
    from glmc.train.ensemble import EnsembleCheckpoint

    # masked-LM: each member's mask stream travels in the checkpoint too, beside its data order
    cfg = compose_config("debug=fast", "model=bert_tiny", "data=pydoc_mlm", "data.limit_train=96", "train.max_epochs=2")
    members = [endpoint_seeds(cfg, s) for s in (0, 1)]
    whole = ensemble._fit(cfg, tmp_path, NoTracker(), members, "")
    real, folder = EnsembleCheckpoint.on_train_epoch_end, tmp_path / "training"

    def then_killed(self, trainer, pl_module):
        real(self, trainer, pl_module)
        raise Killed

    monkeypatch.setattr(EnsembleCheckpoint, "on_train_epoch_end", then_killed)
    with pytest.raises(Killed):
        ensemble._fit(cfg, tmp_path, NoTracker(), members, "", folder)
    assert torch.load(folder / "last.ckpt", weights_only=True)["epoch"] == 0
    monkeypatch.undo()
    with caplog.at_level(logging.INFO):
        resumed = ensemble._fit(cfg, tmp_path, NoTracker(), members, "", folder)
    assert f"train.ensemble: resuming training from {folder / 'last.ckpt'}" in caplog.text
    for k in range(2):  # exactly: the same kernels on the same batches
        want = whole.member_state(k)
        assert all(torch.equal(resumed.member_state(k)[name], want[name]) for name in want), k


def test_an_interrupted_ensembles_checkpoint_is_named_in_what_training_kept(tmp_path):
    from glmc.pipeline.endpoints import training_kept

    cfg = compose_config("debug=fast", f"cache_dir={tmp_path}", "seeds=[0,1,2]")
    beside = EndpointCache(tmp_path).training_dir(cache_key(cfg), 0).parent
    last = beside / ensemble.ensemble_folder_name([0, 1]) / "last.ckpt"
    last.parent.mkdir(parents=True)
    last.write_bytes(b"")
    kept = training_kept(cfg)
    assert f"of seeds 0, 1 checkpointed in {last}, {last}" in kept and "seed 2 with no finished epoch yet" in kept


# digits at a high learning rate: seed 2 stops after epoch 3, seed 1 after epoch 6, seed 0 runs all 8
STOPPING = (
    "debug=fast",
    "data.limit_train=128",
    "train.lr=0.04",
    "train.max_epochs=8",
    "train.early_stopping_patience=1",
)


def test_members_stop_early_and_keep_their_best_epoch_as_the_seeds_trained_alone(tmp_path, one_thread, monkeypatch):
    from glmc.data.module import DataModule
    from glmc.eval.evaluator import Evaluator
    from glmc.pipeline.endpoints import seeds_to_train
    from glmc.train.ensemble import EnsembleModule

    cfg = compose_config(*STOPPING, "logger=none", "seeds=[0,1,2]", "train.ensemble=true", f"cache_dir={tmp_path}")
    data = DataModule(cfg.data, seed=0)
    data.setup()
    evaluator = Evaluator(data.test_dataloader(), task=cfg.data.task, progress=False)
    computed, real = [], EnsembleModule._members_logits
    monkeypatch.setattr(
        EnsembleModule,
        "_members_logits",
        lambda self, x, members: computed.append(len(members)) or real(self, x, members),
    )
    trained = ensemble.train_ensemble(cfg, tmp_path, NoTracker(), evaluator, seeds_to_train, endpoint_seeds, "")
    assert trained == {0, 1, 2}
    assert computed[0] == 3 and computed[-1] == 1 and computed == sorted(computed, reverse=True)  # stopped: left out
    cache, key, epochs = EndpointCache(tmp_path), cache_key(cfg), []
    for seed in (0, 1, 2):
        alone, kept = train_endpoint(cfg, seed, tmp_path, logger=False)
        member = build_model(cfg.model)
        metrics = cache.load(key, seed, member)["metrics"]
        print(f"seed {seed}: kept {metrics['kept']}, alone {kept}")
        assert metrics["kept"]["epoch"] == kept["epoch"]  # the entry records the epoch as a seed alone's does
        assert metrics["kept"]["val_loss"] == pytest.approx(kept["val_loss"], abs=1e-5)
        gap = _relative_gap(dict(member.named_parameters()), dict(alone.named_parameters()))
        print(f"seed {seed}: max relative weight gap {gap:.2e}")
        assert gap < WEIGHTS_RTOL, seed
        assert metrics["test_loss"] == pytest.approx(_evaluate(cfg, alone), abs=1e-4)
        epochs.append(kept["epoch"])
    assert len(set(epochs)) == 3 and min(epochs) < 8  # stopped apart, and early


def test_an_interrupted_ensemble_resumes_each_members_early_stopping(tmp_path, one_thread, monkeypatch):
    from glmc.train.ensemble import EnsembleCheckpoint

    cfg = compose_config(*STOPPING, "logger=none")
    members = [endpoint_seeds(cfg, s) for s in (1, 2)]
    whole = ensemble._fit(cfg, tmp_path, NoTracker(), members, "")
    assert whole.stopping.stopped == [True, True] and whole.trainer.current_epoch == 6  # ended with seed 1's stop
    real, folder = EnsembleCheckpoint.on_train_epoch_end, tmp_path / "training"

    def killed_after_epoch_3(self, trainer, pl_module):
        real(self, trainer, pl_module)
        if trainer.current_epoch == 2:  # seed 2 has just stopped, seed 1 goes on
            raise Killed

    monkeypatch.setattr(EnsembleCheckpoint, "on_train_epoch_end", killed_after_epoch_3)
    with pytest.raises(Killed):
        ensemble._fit(cfg, tmp_path, NoTracker(), members, "", folder)
    saved = torch.load(folder / "last.ckpt", weights_only=True)["callbacks"].values()
    assert [state["stopping"]["stopped"] for state in saved if "stopping" in state] == [[False, True]]
    monkeypatch.undo()
    resumed = ensemble._fit(cfg, tmp_path, NoTracker(), members, "", folder)
    assert resumed.stopping.state_dict()["stopped"] == [True, True] and resumed.trainer.current_epoch == 6
    for k in range(2):  # exactly: the same kernels on the same batches
        (want, want_kept), (got, got_kept) = whole.kept_state(k), resumed.kept_state(k)
        assert got_kept == want_kept and all(torch.equal(got[name], want[name]) for name in want), k


# a budget of 4 optimizer steps (2 epochs of 2 batches); children at step 1 start mid-epoch
SPAWN = ("debug=fast", "logger=none", "endpoints=spawn", "endpoints.steps=[1]", "seeds=[1,5]", "seed_fixed=5")


def test_spawned_children_trained_together_are_those_trained_one_at_a_time(tmp_path, one_thread, caplog):
    from glmc.data.module import DataModule
    from glmc.eval.evaluator import Evaluator
    from glmc.pipeline.children import get_spawned

    children = {}
    for way, extra in (("alone", ()), ("together", ("train.ensemble=true",))):
        cfg = compose_config(*SPAWN, "data.limit_train=128", f"cache_dir={tmp_path / way}", *extra)
        data = DataModule(cfg.data, seed=0)
        data.setup()
        evaluator = Evaluator(list(data.test_dataloader()), task=cfg.data.task, progress=False)
        with caplog.at_level(logging.INFO):
            children[way] = get_spawned(cfg, tmp_path / way, NoTracker(), evaluator)[1]
    assert "seeds [1, 5]: training together as one batched model" in caplog.text
    assert all(not child.cached for child in children["together"].values())  # trained by this run
    for seed, alone in children["alone"].items():
        member = children["together"][seed]
        gap = _relative_gap(dict(member.model.named_parameters()), dict(alone.model.named_parameters()))
        print(f"child of seed {seed}: max relative weight gap {gap:.2e}")
        assert gap < WEIGHTS_RTOL, seed
        assert member.test_loss == pytest.approx(alone.test_loss, abs=1e-4)
    ones = [dict(children["alone"][s].model.named_parameters()) for s in (1, 5)]
    assert _relative_gap(*ones) > 1e-3  # their data orders differ: so do the children


def test_interrupted_spawned_children_resume_at_their_place_in_the_data_order(tmp_path, one_thread, monkeypatch):
    from glmc.pipeline.children import spawn_kept, spawn_points
    from glmc.train.ensemble import EnsembleCheckpoint

    cfg = compose_config(*SPAWN, "data.limit_train=128", f"cache_dir={tmp_path}")
    key = cache_key(cfg)
    point = spawn_points(cfg, key, tmp_path, NoTracker())[1]
    members = [endpoint_seeds(cfg, s) for s in (1, 5)]
    whole = ensemble._fit(cfg, tmp_path, NoTracker(), members, "", None, point)
    child = {**key, "spawned_from": {"seed": 5, "step": 1}}  # where train_ensemble checkpoints step 1's children
    folder = EndpointCache(tmp_path).training_dir(child, 1).parent / ensemble.ensemble_folder_name([1, 5])
    real = EnsembleCheckpoint.on_train_epoch_end

    def then_killed(self, trainer, pl_module):
        real(self, trainer, pl_module)
        raise Killed

    monkeypatch.setattr(EnsembleCheckpoint, "on_train_epoch_end", then_killed)
    with pytest.raises(Killed):  # after the rest of the parent's epoch: one batch
        ensemble._fit(cfg, tmp_path, NoTracker(), members, "", folder, point)
    assert torch.load(folder / "last.ckpt", weights_only=True)["global_step"] == 1
    assert f"step 1's child of seed 5 checkpointed in {folder / 'last.ckpt'}" in spawn_kept(cfg)
    monkeypatch.undo()
    resumed = ensemble._fit(cfg, tmp_path, NoTracker(), members, "", folder, point)
    assert resumed.trainer.global_step == whole.trainer.global_step == 3  # the parent's budget of 4, less 1
    for k in range(2):  # exactly: the same kernels on the same batches
        want = whole.member_state(k)
        assert all(torch.equal(resumed.member_state(k)[name], want[name]) for name in want), k
