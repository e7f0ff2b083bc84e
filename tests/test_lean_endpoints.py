"""Large folders hold one form at a time: each endpoint's Hugging Face model and canonical form built when a
stage asks for them (glmc.pipeline.endpoint_forms), path points interpolated a layer at a time as the forward
reads them (glmc.eval.path_point), B transformed in place when the pair owns its copy. The thresholds are
set to 0 here, so tiny models take the paths a large one takes; every number must be the held run's."""

from __future__ import annotations

import dataclasses
import gc
import importlib
import logging
import re
from pathlib import Path

import pytest
import torch
from test_pretrained_endpoints import TINY, data_overrides, folders, pretrained  # noqa: F401  (a fixture)
from torch.utils.data import DataLoader, TensorDataset

from glmc.alignment import Alignment
from glmc.eval import evaluator as evaluator_module
from glmc.eval.evaluator import Evaluator
from glmc.eval.path_point import MergedParams
from glmc.interpolation import merge_params
from glmc.matching import weight as weight_module
from glmc.matching.weight import weight_matching
from glmc.models.build import build_model
from glmc.models.canonical import canonical_forward
from glmc.models.convert import to_canonical
from glmc.models.families import family_named, family_names
from glmc.pipeline import endpoint_forms
from glmc.pipeline.run import run_pipeline
from glmc.symmetry import apply

pytestmark = pytest.mark.numeric

LAMBDAS = [0.0, 0.3, 1.0]
VOCAB = 40


def _batches(family: str, seed: int = 0) -> tuple[DataLoader, str]:
    """Two batches of random inputs the family's tiny model reads, and the task they are scored on."""
    g = torch.Generator().manual_seed(seed)
    kind = family_named(family)
    if kind.data_kind == "images":
        x, y = torch.randn(8, 1, 8, 8, generator=g), torch.randint(0, 10, (8,), generator=g)
        return DataLoader(TensorDataset(x, y), batch_size=4), "classification"
    ids = torch.randint(5, VOCAB, (8, 12), generator=g)
    task = "causal_lm" if "causal_lm" in kind.tasks else "masked_lm"
    targets = ids.clone() if task == "causal_lm" else torch.where(torch.rand(8, 12, generator=g) < 0.3, ids, -100)
    return DataLoader(TensorDataset(ids, targets), batch_size=4), task


def _hf(family: str, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    fixed = family_named(family).fixed_model_values
    cfg = dataclasses.replace(TINY, family=family, max_positions=12, **{"vocab_size": VOCAB, **fixed})
    return build_model(cfg).eval()


@pytest.mark.parametrize("family", family_names())
def test_a_layerwise_point_of_original_models_gives_the_whole_points_losses(family, monkeypatch):
    """Vanilla's path: each unit's parameters interpolated while it runs, every family's Hugging Face model."""
    a, b = _hf(family, 0), _hf(family, 1)
    data, task = _batches(family)
    whole = Evaluator(data, task, progress=False).path(Alignment(a, b), LAMBDAS)["loss"]
    monkeypatch.setattr(evaluator_module, "LAYERWISE_POINTS_FROM", 0)
    layerwise = Evaluator(data, task, progress=False).path(Alignment(a, b), LAMBDAS)["loss"]
    assert layerwise == pytest.approx(whole, rel=1e-6)
    assert layerwise[0] != pytest.approx(layerwise[-1], rel=1e-6)  # the two ends differ: B was read at 0
    before = {k: v.clone() for k, v in a.state_dict().items()}
    Evaluator(data, task, progress=False).path(Alignment(a, b), [0.5])
    assert all(torch.equal(v, before[k]) for k, v in a.state_dict().items())  # A's own parameters are back


def test_a_unit_that_fails_leaves_the_reference_as_it_was(monkeypatch):
    a, b = _hf("gpt_neox", 0), _hf("gpt_neox", 1)
    data, task = _batches("gpt_neox")
    monkeypatch.setattr(evaluator_module, "LAYERWISE_POINTS_FROM", 0)
    before = {k: v.clone() for k, v in a.state_dict().items()}
    layer = a.gpt_neox.layers[0]
    handle = layer.mlp.register_forward_hook(lambda *args: (_ for _ in ()).throw(RuntimeError("inside the layer")))
    with pytest.raises(RuntimeError, match="inside the layer"):
        Evaluator(data, task, progress=False).path(Alignment(a, b), [0.5])
    handle.remove()
    assert all(torch.equal(v, before[k]) for k, v in a.state_dict().items())
    assert all(isinstance(p, torch.nn.Parameter) for p in a.parameters())


@pytest.mark.parametrize("circuits", [(), ("qk", "vo")])
def test_merged_params_read_a_layer_at_a_time_are_the_merged_models(circuits):
    a, b = to_canonical(_hf("gpt_neox", 0)), to_canonical(_hf("gpt_neox", 1))
    ids = torch.randint(5, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    for lam in (0.0, 0.4, 1.0):
        ends, weights = [a.params(), b.params()], [lam, 1.0 - lam]
        lazy = MergedParams(ends, weights, circuits)
        assert sorted(lazy) == sorted(ends[0]) and len(lazy) == len(ends[0])
        whole = merge_params(ends, weights, circuits)
        assert all(torch.equal(lazy[k], whole[k]) for k in whole)
        with torch.no_grad():
            assert torch.equal(canonical_forward(a.config, lazy, ids), canonical_forward(a.config, whole, ids))
        assert (
            set(lazy.kept) <= {k for k in whole if not k.startswith("blocks.")}
            or len({k.split(".")[1] for k in lazy.kept}) == 1
        )  # one layer (or one outside tensor) held


def test_apply_in_place_and_by_rows_gives_the_new_models_floats(monkeypatch):
    module = importlib.import_module("glmc.symmetry.apply")  # the package's `apply` is the function
    a, b = to_canonical(_hf("gpt_neox", 0)), to_canonical(_hf("gpt_neox", 1))
    transform, _ = weight_matching(a, b, max_iter=2)
    new = apply(transform, b)
    monkeypatch.setattr(module, "ROWS_AT_A_TIME", 7 * TINY.hidden_size)  # the vocabulary in chunks of 7 rows
    params = b.params()
    pointers = {k: t.data_ptr() for k, t in params.items()}
    moved = module.apply(transform, b, in_place=True)
    assert moved is b and all(moved.params()[k] is params[k] for k in params)  # the same Parameters
    assert all(torch.equal(moved.params()[k], new.params()[k]) for k in params)
    chunked = [k for k, t in params.items() if t.numel() > 7 * TINY.hidden_size and t.dim() == 2 and "blocks" not in k]
    assert chunked and all(params[k].data_ptr() == pointers[k] for k in chunked)  # rows written into its own tensor


def test_a_large_folders_run_gives_the_held_runs_numbers(folders, tmp_path, monkeypatch, caplog):  # noqa: F811
    a, b = folders("gpt_neox", "a", seed=0), folders("gpt_neox", "b", seed=1)
    cfg = pretrained([a, b], *data_overrides("gpt_neox"), "matcher.methods=[vanilla,weight]", tmp_path=tmp_path)
    held = run_pipeline(cfg, tmp_path / "held")
    monkeypatch.setattr(endpoint_forms, "HOLD_BELOW", 0)
    monkeypatch.setattr(evaluator_module, "LAYERWISE_POINTS_FROM", 0)
    searches = []
    search = weight_module.weight_matching
    monkeypatch.setattr(weight_module, "weight_matching", lambda *a, **kw: searches.append(kw) or search(*a, **kw))
    caplog.clear()  # (the held run's lines too where an earlier test left the loggers at INFO)
    with caplog.at_level(logging.INFO, logger="glmc.pipeline.endpoint_forms"):
        with caplog.at_level(logging.INFO, logger="glmc.pipeline.hf_folders"):
            lean = run_pipeline(cfg, tmp_path / "lean")
    reads = [x for x in caplog.messages if "weights" in x and "loading" in x]
    # each folder read once for its canonical form, test loss and first logits, once for vanilla's path
    assert sorted(x.split(":")[0] for x in reads) == sorted(
        2 * [f"endpoints.paths[{i}]={p}" for i, p in enumerate((a, b))]
    )
    assert [kw["layerwise"] for kw in searches] == [True]  # the search holds a layer at a time too
    files = [Path(m.group(1)) for m in (re.search(r"kept in (\S+) while", x) for x in caplog.messages) if m]
    assert len(files) == 2  # each folder converted once, its canonical form written aside
    gc.collect()
    assert not any(f.exists() for f in files)  # removed once the run's endpoints are gone
    assert [e["test_loss"] for e in lean["endpoints"]] == [e["test_loss"] for e in held["endpoints"]]
    assert [e["width"] for e in lean["endpoints"]] == [e["width"] for e in held["endpoints"]]
    for name in ("vanilla", "weight"):
        ours, theirs = lean["methods"][name]["pairs"][0], held["methods"][name]["pairs"][0]
        assert ours["test_loss"] == pytest.approx(theirs["test_loss"], rel=1e-6), name
        assert ours["barrier"] == pytest.approx(theirs["barrier"], rel=1e-6, abs=1e-7), name
        assert ours["endpoint_deviation"] == pytest.approx(theirs["endpoint_deviation"], rel=1e-3, abs=1e-7), name


def test_vanilla_takes_original_models_or_canonical_ones_with_their_source():
    from glmc.matching.vanilla import VanillaMatcher

    a, b = _hf("gpt2", 0), _hf("gpt2", 1)
    direct = VanillaMatcher().match(a, b)
    assert direct.reference is a and direct.model is b
    through = VanillaMatcher().match(to_canonical(a), to_canonical(b))
    assert through.reference is a and through.model is b
    with pytest.raises(ValueError, match="keep their source model"):
        VanillaMatcher().match(to_canonical(a).clone(), to_canonical(b))


@pytest.mark.parametrize("task", ["causal_lm", "masked_lm"])
def test_large_token_logits_are_scored_a_few_examples_at_a_time_to_the_same_sums(task, monkeypatch):
    from glmc import metrics

    g = torch.Generator().manual_seed(0)
    logits, targets = torch.randn(7, 5, 11, generator=g), torch.randint(0, 11, (7, 5), generator=g)
    targets[0, 2] = metrics.IGNORE_INDEX
    whole = metrics.loss_and_correct(logits, targets, task)
    monkeypatch.setattr(metrics, "LOSS_CHUNK_BYTES", 2 * 5 * 11 * 4)  # two examples at a time
    chunked = metrics.loss_and_correct(logits, targets, task)
    assert float(chunked[0]) == pytest.approx(float(whole[0]), rel=1e-6)
    assert int(chunked[1]) == int(whole[1]) and int(chunked[2]) == int(whole[2])


@pytest.mark.parametrize("family", family_names())
def test_a_layerwise_canonical_point_scores_its_head_a_few_examples_at_a_time(family, monkeypatch):
    """Weight's path on canonical ends: the state the head reads computed once per batch, the head's logits
    for at most two examples at a time, the losses those of the whole point."""
    a, b = to_canonical(_hf(family, 0)), to_canonical(_hf(family, 1))
    data, task = _batches(family)
    whole = Evaluator(data, task, progress=False).path(Alignment(a, b), LAMBDAS)
    monkeypatch.setattr(evaluator_module, "LAYERWISE_POINTS_FROM", 0)
    per_example = next(iter(data))[0][:1]
    with torch.no_grad():
        size = 4 * canonical_forward(a.config, a.params(), per_example).numel()
    monkeypatch.setattr(evaluator_module, "LOSS_CHUNK_BYTES", 2 * size)
    family_kind, seen = family_named(family), []
    head = family_kind.head
    monkeypatch.setattr(type(family_kind), "head", lambda self, *args: seen.append(len(args[2])) or head(*args))
    layerwise = Evaluator(data, task, progress=False).path(Alignment(a, b), LAMBDAS)
    assert layerwise["loss"] == pytest.approx(whole["loss"], rel=1e-6)
    assert layerwise["accuracy"] == pytest.approx(whole["accuracy"], abs=1e-12)
    assert seen == [1, 2, 1] * (len(LAMBDAS) * len(data))  # the first example alone, then two at a time


def test_hugging_face_language_models_are_evaluated_without_their_cache():
    model, calls = _hf("gpt_neox", 0), []
    record = lambda module, args, kwargs: calls.append(kwargs.get("use_cache"))  # noqa: E731
    model.register_forward_pre_hook(record, with_kwargs=True)
    data, task = _batches("gpt_neox")
    Evaluator(data, task, progress=False).evaluate(model)
    assert calls and all(c is False for c in calls)
    assert evaluator_module._no_cache(torch.nn.Linear(2, 2)) == {}  # a model without the option gets none
