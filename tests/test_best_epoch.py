"""Early stopping caches the weights of the epoch with the lowest validation loss, not the last ones."""

from __future__ import annotations

import random

import pytest
import torch
from lightning.pytorch.callbacks import Callback

import glmc.pipeline.endpoints as endpoints
from glmc.data.module import DataModule
from glmc.eval.evaluator import Evaluator
from glmc.pipeline.endpoints import cache_key, train_endpoint
from glmc.pipeline.run import run_pipeline
from glmc.report.artefact import TINY_TEXT_MODEL
from glmc.train.best_epoch import BestEpochWeights

from conftest import compose_config


def _corpus(root, seed: int = 0) -> None:
    """Training text of random letters and validation/test text of other random letters: the model
    learns the letters' frequencies first, then memorises the training text, and the validation loss rises."""
    draw = random.Random(seed)
    letters = lambda n: "".join(draw.choice("abcdefgh") for _ in range(n))  # noqa: E731
    (root / "tiny_shakespeare").mkdir(parents=True)
    (root / "tiny_shakespeare" / "input.txt").write_text(letters(1600) + letters(200) + letters(200))


def _overrides(root) -> list[str]:
    return [
        "experiment=text_demo",
        *TINY_TEXT_MODEL,
        "data=tiny_shakespeare",
        f"data.root={root}",
        "data.seq_len=16",
        "model.max_positions=16",
        "data.val_fraction=0.1",
        "data.test_fraction=0.1",
        "data.batch_size=16",
        "train.lr=0.01",
        "train.max_epochs=40",
        "train.early_stopping_patience=3",
        "trainer.enable_progress_bar=false",
        "logger=none",
    ]


class _ValLosses(Callback):
    def __init__(self):
        self.losses: list[float] = []

    def on_validation_end(self, trainer, module):
        self.losses.append(float(trainer.callback_metrics["val_loss"]))


def test_early_stopping_keeps_the_best_epochs_weights(tmp_path, monkeypatch):
    _corpus(tmp_path)
    cfg = compose_config(*_overrides(tmp_path))
    seen = _ValLosses()
    factory = endpoints.trainer_factory
    with_seen = lambda trainer_cfg: lambda callbacks=(), **kw: factory(trainer_cfg)(callbacks=[*callbacks, seen], **kw)
    monkeypatch.setattr(endpoints, "trainer_factory", with_seen)
    model, kept = train_endpoint(cfg, 0, tmp_path / "run", logger=False)

    best = min(range(len(seen.losses)), key=seen.losses.__getitem__)
    assert seen.losses[-1] > seen.losses[best]  # the validation loss rose past its best
    assert len(seen.losses) == best + 1 + 3  # early stopping ended `patience` epochs after the best
    assert kept == {"epoch": best + 1, "val_loss": seen.losses[best]}
    data = DataModule(cfg.data, seed=0)
    data.setup()
    loss, _ = Evaluator(data.val_dataloader(), task="causal_lm", progress=False).evaluate(model)
    assert loss == pytest.approx(seen.losses[best], rel=1e-5)  # the model holds the best epoch's weights


def test_the_kept_epoch_is_recorded_in_the_cache_and_results(tmp_path):
    _corpus(tmp_path)
    overrides = [*_overrides(tmp_path), "matcher.methods=[vanilla]", "eval.num_lambdas=3", f"cache_dir={tmp_path}/c"]
    results = run_pipeline(compose_config(*overrides), tmp_path / "run")
    kept = [e["kept"] for e in results["endpoints"]]
    assert all(1 <= k["epoch"] < 40 and k["val_loss"] > 0 for k in kept)
    again = run_pipeline(compose_config(*overrides), tmp_path / "again")  # from the cache: the same record
    assert [e["kept"] for e in again["endpoints"]] == kept and all(e["cached"] for e in again["endpoints"])
    without = compose_config(*overrides, "train.early_stopping_patience=null")
    assert "kept_weights" in cache_key(compose_config(*overrides))["train"]
    assert "kept_weights" not in cache_key(without)["train"]  # without early stopping nothing changes


def test_a_resumed_run_keeps_the_best_weights_of_before_the_interruption():
    linear = torch.nn.Linear(2, 2)
    best = BestEpochWeights()
    best.load_state_dict(
        {"loss": 0.5, "epoch": 3, "weights": {k: torch.zeros_like(v) for k, v in linear.state_dict().items()}}
    )
    assert best.kept() == {"epoch": 3, "val_loss": 0.5}
    best.on_fit_end(None, linear)
    assert all(torch.equal(v, torch.zeros_like(v)) for v in linear.state_dict().values())
    assert best.state_dict()["epoch"] == 3
