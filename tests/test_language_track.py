"""The GPT-2 language track: vocabulary-restricted weight matching, the text pipeline end to end,
clear errors, and learned matching that never returns a path worse than its start."""

from __future__ import annotations

import math

import pytest
import torch

from glmc.matching.weight import weight_matching
from glmc.models import to_canonical
from glmc.pipeline.outputs import format_table, summary_line
from glmc.pipeline.run import run_pipeline
from glmc.report.artefact import TINY_TEXT_MODEL
from glmc.symmetry import SymmetrySpec, Transform, apply

from conftest import compose_config
from numeric import FEW_OPS, FORWARD, assert_close_rel
from tiny_hf import tiny_gpt2

# a seconds-long text run: a 1-layer GPT-2 on a slice of the embedded corpus
TINY_TEXT = [
    "experiment=text_demo",
    *TINY_TEXT_MODEL,
    "data.limit_train=96",
    "data.limit_test=24",
    "train.max_epochs=1",
    "matcher.learned.max_steps=4",
    "eval.num_lambdas=3",
    "trainer.enable_progress_bar=false",
    "logger=none",
]


@pytest.mark.numeric
def test_weight_matching_on_used_tokens_ignores_the_rest_of_the_vocabulary():
    a = to_canonical(tiny_gpt2(0))
    spec = SymmetrySpec.from_model(a)
    g = torch.Generator().manual_seed(0)
    hidden = Transform.sample(spec, {"residual": "orthogonal", "heads": "permutation", "mlp": "permutation"}, g)
    b = apply(hidden, a)  # A in disguise: the same function
    used = torch.arange(0, 97, 3)  # the tokens of a "training split"
    unused = torch.tensor([i for i in range(97) if i not in set(used.tolist())])
    params = b.params()
    with torch.no_grad():  # untrained rows of B: noise that no training data ever shaped
        for name in ("embed.tokens", "head.w"):
            params[name][unused] = 5 * torch.randn(len(unused), params[name].shape[1], generator=g)
    x = used[torch.randint(0, len(used), (4, 11), generator=g)]
    on_used = lambda model: model(x)[..., used]  # logits of the tokens the data has
    found, diag = weight_matching(a, b, tokens=used)
    assert diag["final_distance"] < 1e-4
    assert_close_rel(on_used(apply(found, b)), on_used(a), FORWARD, "used-token logits")  # recovered exactly
    _, diag_all = weight_matching(a, b)
    assert diag_all["final_distance"] > 0.1  # unrestricted, the noise rows dominate the objective


def test_text_pipeline_end_to_end(tmp_path):
    cfg = compose_config(*TINY_TEXT, f"cache_dir={tmp_path / 'endpoints'}")
    results = run_pipeline(cfg, tmp_path / "run")
    assert results["task"] == "causal_lm" and results["dataset"] == "pydoc"
    for e in results["endpoints"]:
        assert e["test_accuracy"] is None and 0 < e["test_loss"] < math.log(cfg.model.vocab_size) + 1
    assert list(results["methods"]) == list(cfg.matcher.methods)
    for name, m in results["methods"].items():
        assert m["test_perplexity"] == pytest.approx([math.exp(x) for x in m["test_loss"]]), name
        assert m["barrier"] >= 0 and m["pairs"][0]["endpoint_deviation"] < 1e-4, name
    weight = results["methods"]["weight"]["pairs"][0]["diagnostics"]
    assert 30 < weight["vocabulary_rows"] <= 103  # the characters of the training slice, not all 128 ids
    learned = results["methods"]["learned"]["pairs"][0]["diagnostics"]
    assert set(learned["validation_path_max_loss"]) == {"start", "learned"}
    assert learned["kept_start"] == (
        learned["validation_path_max_loss"]["learned"] > learned["validation_path_max_loss"]["start"]
    )
    table = format_table(results)
    assert "mid ppl" in table and "perplexity" in table and "accuracy" not in table
    summary = table.splitlines()[-1]  # the line under the table, in the order weight_perm, weight, learned
    vanilla = results["methods"]["vanilla"]["barrier"]
    shares = [100 * (1 - results["methods"][m]["barrier"] / vanilla) for m in ("weight", "learned")]
    assert summary == summary_line(results["methods"])
    assert summary.startswith(f"Of the vanilla barrier ({vanilla:.3f}), ")
    assert f"weight matching {shares[0]:.0f} %" in summary or f"weight matching removed {shares[0]:.0f} %" in summary
    assert summary.endswith(f"learned matching {shares[1]:.0f} %.")


def test_vocabulary_too_small_for_the_tokenizer_fails_before_training(tmp_path):
    cfg = compose_config(*TINY_TEXT, "model.vocab_size=50", f"cache_dir={tmp_path / 'endpoints'}")
    with pytest.raises(ValueError, match="model.vocab_size=50"):
        run_pipeline(cfg, tmp_path / "run")
    assert not (tmp_path / "endpoints").exists()
    cfg = compose_config(*TINY_TEXT, "model=vit_tiny", f"cache_dir={tmp_path / 'endpoints'}")
    with pytest.raises(ValueError, match="model.family=gpt2"):
        run_pipeline(cfg, tmp_path / "run2")


def test_early_stopping_needs_a_validation_split(tmp_path):
    # digits without their held-out tenth: nothing to watch
    cfg = compose_config(
        "debug=fast", "logger=none", "data.val_fraction=0", "train.early_stopping_patience=2", f"cache_dir={tmp_path}"
    )
    with pytest.raises(ValueError, match="validation split"):
        run_pipeline(cfg, tmp_path / "run")


def test_early_stopping_on_text_stops_when_validation_stalls(tmp_path):
    from glmc.pipeline.endpoints import train_endpoint

    # lr 0 never improves val_loss: patience 1 stops after the second validation
    cfg = compose_config(*TINY_TEXT, "train.max_epochs=20", "train.lr=0", "train.early_stopping_patience=1")
    seen = []
    from lightning.pytorch.callbacks import Callback

    class Count(Callback):
        def on_train_epoch_end(self, trainer, module):
            seen.append(trainer.current_epoch)

    import glmc.pipeline.endpoints as endpoints

    factory = endpoints.trainer_factory

    def with_counter(trainer_cfg):
        make = factory(trainer_cfg)
        return lambda callbacks=(), **kw: make(callbacks=[*callbacks, Count()], **kw)

    endpoints.trainer_factory = with_counter
    try:
        train_endpoint(cfg, 0, tmp_path, logger=False)
    finally:
        endpoints.trainer_factory = factory
    assert 2 <= len(seen) <= 3


def test_learned_matching_keeps_its_start_when_the_learned_path_is_worse(tmp_path, monkeypatch):
    from glmc.data.module import DataModule
    from glmc.eval.evaluator import path_losses
    from glmc.matching.base import MatchContext
    from glmc.matching.learned_module import LearnedMatchingModule
    from glmc.matching.registry import build_matcher, method_config
    from glmc.train.latent_fit import fit_latents
    from glmc.train.trainer import trainer_factory

    cfg = compose_config(*TINY_TEXT)
    data = DataModule(cfg.data)
    data.setup()
    from glmc.models.build import build_model

    a, b = (to_canonical(build_model(cfg.model).eval()) for _ in range(2))  # two random initialisations
    spec = SymmetrySpec.from_model(b)
    rotten = Transform.sample(spec, {"residual": "orthogonal", "heads": "permutation", "mlp": "permutation"})
    monkeypatch.setattr(LearnedMatchingModule, "hard_transform", lambda self: rotten)  # a random "result"
    matcher = build_matcher(method_config(cfg, "learned"))
    make = trainer_factory(cfg.trainer)
    context = MatchContext(data=data, trainer=make, run_dir=tmp_path, fit=fit_latents, path_loss=path_losses)
    result = matcher.match(a, b, context)
    d = result.diagnostics
    assert d["kept_start"] and d["validation_path_max_loss"]["learned"] > d["validation_path_max_loss"]["start"]
    start, _ = weight_matching(a, b, tokens=context.token_ids(cfg.model.vocab_size))
    for name, g in start.items():
        h = result.transform[name]
        if hasattr(g, "perm"):
            assert torch.equal(g.perm, h.perm), name
        else:
            assert_close_rel(h.matrix, g.matrix, FEW_OPS, f"kept start {name}")
