"""Checks the causal-LM family test modules (test_gemma.py, test_opt.py, test_qwen3.py, ...) run on their
tiny models: every symmetry class the spec claims, glmc.align keeping B's function, an export reloaded with
from_pretrained, and run.py on two save_pretrained folders."""

from __future__ import annotations

import json
import math

import pytest
import torch
from test_pretrained_endpoints import FAST, SEQ_LEN, char_tokenizer
from torch.utils.data import DataLoader, TensorDataset

import glmc
from glmc.config import ModelConfig
from glmc.models import to_canonical
from glmc.models.build import build_model
from glmc.models.export import export_hf
from glmc.symmetry import SymmetrySpec, Transform, apply

from conftest import run_script
from numeric import FORWARD, assert_close_rel
from tiny_hf import inputs_for

# few steps and iterations: the tests check that the result keeps B, not how good it is
MATCHERS = {
    "weight": dict(max_iter=3),
    "activation": dict(batches=2),
    "learned": dict(max_steps=2, lr=1e-2, weight_max_iter=3, checkpoint_every=10**6),
}

# the (space kind, class) pairs a family's CASES are made of, grouped by the tensors whose maps they are
# an RMS-normalised stream (Llama-style): orthogonal maps, and signed permutations as a class of their own
STREAM = {("residual", "orthogonal"), ("residual", "signed_permutation"), ("residual", "permutation")}
# a norm with a gain on each sublayer's output (sandwich norms): signed permutations
SANDWICH_STREAM = {("residual", "signed_permutation"), ("residual", "permutation")}
# HEADS where several query heads share a key/value head (grouped-query); MULTI_HEAD where each query head
# has its own: the spec builds no qheads space for one query head per group
MULTI_HEAD = {("heads", "permutation"), ("heads", "semi_permutation")}
HEADS = MULTI_HEAD | {("qheads", "permutation")}
ROTARY_QK = {("qk", "rotary_scale")}
VO = {("vo", "invertible"), ("vo", "orthogonal_scale")}
GATED_MLP = {("mlp", "permutation"), ("mlp_scale", "diagonal")}
EXPERTS = {("experts", "permutation"), ("expert_units", "permutation"), ("expert_scale", "diagonal")}


def claimed(model) -> set[tuple[str, str]]:
    """(space kind, class) for every class a space of the model's SymmetrySpec offers."""
    return {(space.kind, cls) for space in SymmetrySpec.from_model(model) for cls in space.classes}


def assert_symmetry_keeps_function(model, x, classes: dict[str, str], what: str) -> None:
    """A random element of `classes` (space kind -> class; widening classes add two units) changes the
    weights and keeps the logits."""
    grow = 2 if "semi_permutation" in classes.values() else 0
    transform = Transform.sample(SymmetrySpec.from_model(model), classes, torch.Generator().manual_seed(0), grow=grow)
    assert transform, f"{what}: no space takes {classes}"
    new = apply(transform, model)
    assert any(
        new.params()[k].shape != v.shape or not torch.equal(new.params()[k], v) for k, v in model.params().items()
    ), f"{what}: nothing moved"
    with torch.no_grad():
        assert_close_rel(new(x), model(x), FORWARD, f"{what}: logits")


def canonical_fixture(build, **settings):
    """A module-scoped fixture named `canonical`: the canonical form of build(**settings) and inputs for it."""

    @pytest.fixture(scope="module", name="canonical")
    def canonical():
        hf = build(**settings)
        return to_canonical(hf), inputs_for(hf)

    return canonical


def symmetry_tests(cases: set[tuple[str, str]]):
    """The two tests a family module runs on its `canonical` fixture: its spec claims exactly `cases`
    ((space kind, class) pairs), and a random element of each keeps the logits."""

    def test_the_cases_are_what_the_spec_claims(canonical):
        found = claimed(canonical[0])
        assert found == cases, (
            f"the spec claims these not in CASES: {sorted(found - cases)}; "
            f"CASES lists these the spec lacks: {sorted(cases - found)}"
        )

    @pytest.mark.parametrize("kind,group", sorted(cases))
    def test_symmetry_preserves_function(canonical, kind, group):
        model, x = canonical
        assert_symmetry_keeps_function(model, x, {kind: group}, f"{kind} {group}")

    return test_the_cases_are_what_the_spec_claims, test_symmetry_preserves_function


def next_token_data(vocab: int, n: int = 16, seq: int = 12, seed: int = 0) -> DataLoader:
    ids = torch.randint(0, vocab, (n, seq), generator=torch.Generator().manual_seed(seed))
    return DataLoader(TensorDataset(ids[:, :-1].contiguous(), ids[:, 1:].contiguous()), batch_size=8)


def assert_alignment_keeps_b(hf_a, hf_b, method: str, data: DataLoader, run_dir) -> set[str]:
    """glmc.align of A onto B keeps B's logits; the kinds of the spaces its transform maps."""
    trainer = {"accelerator": "cpu", "enable_progress_bar": False}
    alignment = glmc.align(hf_a, hf_b, method, data=data, run_dir=run_dir, trainer=trainer, **MATCHERS[method])
    assert alignment.function_preserving and alignment.transform, method
    x = next(iter(data))[0]
    with torch.no_grad():
        assert_close_rel(alignment.model(x), hf_b(x).logits, FORWARD, f"{method}: aligned B vs B")
    return {name.split(".")[0] for name in alignment.transform}


def alignment_tests(build, methods=("weight", "activation", "learned"), mapped=(), unmapped=()):
    """A module-scoped fixture named `pair` (build(seed=0), build(seed=1), next-token data) and a test that
    glmc.align keeps B under each of `methods`, mapping every space kind in `mapped` and none in `unmapped`."""

    @pytest.fixture(scope="module", name="pair")
    def pair():
        a = build(seed=0)
        return a, build(seed=1), next_token_data(min(61, a.config.vocab_size))  # ids the tiny model has

    @pytest.mark.parametrize("method", list(methods))
    def test_alignment_keeps_b(pair, method, tmp_path):
        hf_a, hf_b, data = pair
        spaces = assert_alignment_keeps_b(hf_a, hf_b, method, data, tmp_path)
        assert set(mapped) <= spaces and not set(unmapped) & spaces, spaces

    return pair, test_alignment_keeps_b


def assert_export_reloads(hf, run_dir, kept: tuple[str, ...] = ()) -> None:
    """The canonical form of `hf` exported with `hf` as template reloads with from_pretrained and gives the
    same logits, and each parameter named in `kept` (e.g. a norm the export writes back) comes back as it was."""
    model, x = to_canonical(hf), inputs_for(hf)
    loaded = type(hf).from_pretrained(export_hf(model, hf, run_dir / "out")).eval()
    with torch.no_grad():
        assert_close_rel(loaded(x).logits, hf(x).logits, FORWARD, "exported vs original logits")
    for name in kept:
        assert torch.allclose(loaded.get_parameter(name), hf.get_parameter(name)), name


def bfloat16_folders_test(family: str, blocks: dict, residual: str | None = None, **model):
    """The test that run.py runs on two bfloat16 folders of `family` (cli_on_two_folders), records the
    block kinds `blocks` (and the residual class, where given) in results.json and finds a weight transform
    that keeps the function."""

    def test_command_line_on_two_bfloat16_folders(monkeypatch, capsys, tmp_path):
        results = cli_on_two_folders(monkeypatch, capsys, tmp_path, family, dtype=torch.bfloat16, **model)
        assert results["stored_dtype"] == "bfloat16"
        assert results["symmetry"]["blocks"] == blocks
        assert residual is None or results["symmetry"]["residual"] == residual
        assert results["methods"]["weight"]["pairs"][0]["function_preserving"]

    return test_command_line_on_two_bfloat16_folders


def cli_on_two_folders(
    monkeypatch, capsys, tmp_path, family: str, dtype=torch.float32, extra: tuple[str, ...] = (), **model
) -> dict:
    """run.py with endpoints=pretrained on two tiny save_pretrained folders of `family` stored in `dtype`
    (weight matching, the vanilla midpoint exported; `extra` overrides); results.json, after checking the run
    succeeded."""
    tokenizer = char_tokenizer()
    folders = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        cfg = ModelConfig(
            family=family, hidden_size=16, num_layers=1, num_heads=2, mlp_size=32, vocab_size=len(tokenizer), **model
        )
        folder = tmp_path / f"{family}_{seed}"
        build_model(cfg).to(dtype).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        folders.append(folder)
    run = tmp_path / "run"
    paths = ",".join(str(f) for f in folders)
    args = ("endpoints=pretrained", f"endpoints.paths=[{paths}]", "data=pydoc", f"data.seq_len={SEQ_LEN}")
    methods = ("matcher.methods=[vanilla,weight]", "merge.export=true", f"hydra.run.dir={run}")
    code, _, err = run_script(monkeypatch, capsys, *FAST, *args, *methods, *extra)
    assert code == 0, err[-3000:]
    results = json.loads((run / "results.json").read_text())
    assert results["model"].startswith(f"{family} (")
    for name in ("vanilla", "weight"):
        assert math.isfinite(results["methods"][name]["pairs"][0]["barrier"]), name
    export = results["methods"]["vanilla"]["pairs"][0]["export"]
    # a half-precision export is read back after rounding to its dtype
    assert export["exported"] and export["relative_deviation"] < (1e-5 if dtype == torch.float32 else 2e-2), export
    return results
