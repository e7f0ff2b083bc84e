"""A narrower GPT-2 embedded into a wider one with its stream kept (embed_stream=keep) carries the norm epsilon
eps * m / M: the path between them interpolates the epsilon with the weights, so it ends at each model as
the pipeline checks (float32 relative tolerance on the loss). Models at Hugging Face's own initialisation
(std 0.02) hold a small stream, where an epsilon taken from the wide model moved the narrow end by 2e-4."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from test_pretrained_endpoints import FAST, TINY, char_tokenizer

from glmc.alignment import Alignment
from glmc.eval.barrier import END_RTOL
from glmc.eval.evaluator import Evaluator
from glmc.interpolation import interpolate
from glmc.models.build import build_model
from glmc.models.canonical import relative_deviation
from glmc.models.convert import to_canonical
from glmc.pipeline.run import run_pipeline
from glmc.symmetry.embed_width import match_widths

from conftest import compose_config

WIDTHS = (64, 32)


def _gpt2(width: int, seed: int, vocab: int):
    torch.manual_seed(seed)
    cfg = dataclasses.replace(
        TINY, family="gpt2", vocab_size=vocab, hidden_size=width, num_heads=2, mlp_size=2 * width, layer_norm_eps=1e-5
    )
    return build_model(cfg).eval()


@pytest.fixture(scope="module")
def gpt2_folders(tmp_path_factory):
    """Two save_pretrained GPT-2 folders of widths 64 and 32 (GPT-2's epsilon 1e-5), with their tokenizer."""
    root, tokenizer = tmp_path_factory.mktemp("widths"), char_tokenizer()
    paths = []
    for seed, width in enumerate(WIDTHS):
        folder = root / f"gpt2_{width}"
        _gpt2(width, seed, len(tokenizer)).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        paths.append(folder)
    return paths


def test_the_path_to_an_embedded_narrow_model_ends_at_it():
    wide, narrow = (to_canonical(_gpt2(w, s, 100)) for s, w in enumerate(WIDTHS))
    embedded = match_widths(wide, narrow, torch.Generator().manual_seed(1), "keep")
    assert embedded.config.norm_eps != wide.config.norm_eps  # eps * 32 / 64: what the path must carry
    x = torch.randint(0, 100, (8, 16), generator=torch.Generator().manual_seed(2))
    loader = [(x, torch.roll(x, -1, 1))]
    evaluator = Evaluator(loader, "causal_lm", progress=False)
    own = evaluator.evaluate(narrow)[0]
    curve = evaluator.path(Alignment(wide, embedded), [0.0, 0.5, 1.0])["loss"]
    assert abs(curve[0] - own) <= 1e-6 * own < END_RTOL * own
    assert abs(curve[2] - evaluator.evaluate(wide)[0]) <= 1e-6 * curve[2]
    # the interpolated model at lambda=0 is the embedded model, its logits the narrow model's
    end = interpolate([wide, embedded], [0.0, 1.0])
    assert end.config.norm_eps == embedded.config.norm_eps
    assert relative_deviation(end(x), narrow(x)) < 1e-5
    # in between, the epsilon is interpolated with the weights
    eps = interpolate([wide, embedded], [0.5, 0.5]).config.norm_eps
    assert math.isclose(eps, 0.5 * (wide.config.norm_eps + embedded.config.norm_eps))


def test_two_gpt2_folders_of_different_widths_run_through_the_pipeline(gpt2_folders, tmp_path):
    listed = ",".join(str(p) for p in gpt2_folders)
    cfg = compose_config(
        *FAST,
        f"cache_dir={tmp_path / 'cache'}",
        "endpoints=pretrained",
        f"endpoints.paths=[{listed}]",
        "data=pydoc",
        "data.seq_len=16",
        "matcher.methods=[weight,learned]",
        "matcher.learned.max_steps=4",
    )
    assert cfg.embed_stream == "keep"
    results = run_pipeline(cfg, tmp_path / "run")
    assert [e["width"] for e in results["endpoints"]] == list(WIDTHS)
    loss_wide, loss_narrow = (e["test_loss"] for e in results["endpoints"])
    for method in ("weight", "learned"):
        pair = results["methods"][method]["pairs"][0]
        assert pair["lambdas"][0] == 0.0 and pair["lambdas"][-1] == 1.0
        assert abs(pair["test_loss"][0] - loss_narrow) <= 1e-5 * loss_narrow, method
        assert abs(pair["test_loss"][-1] - loss_wide) <= 1e-5 * loss_wide, method
        assert pair["endpoint_deviation"] < 1e-4 and math.isfinite(pair["barrier"]), method
