"""Layer-wise barriers (glmc.eval.layerwise): interpolating no part is the held end, every part the straight
line float for float; a difference in one block shows only in that block's curve; original models' tensors
are grouped by module path; the API checks its inputs and a run writes the record, its figures and CSV."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import glmc
from glmc.alignment import Alignment
from glmc.eval.evaluator import Evaluator, Functional
from glmc.eval.layerwise import PartPaths, layerwise_barriers, tensor_parts
from glmc.models import to_canonical
from glmc.models.canonical import CanonicalTransformer

from tiny_hf import tiny_gpt2, tiny_vit

LAMBDAS = [0.0, 0.25, 0.5, 1.0]


def images(n=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    return DataLoader(TensorDataset(torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g)), 12)


def tokens(n=8, seed=0):
    ids = torch.randint(0, 97, (n, 11), generator=torch.Generator().manual_seed(seed))
    return DataLoader(TensorDataset(ids, ids), batch_size=4)


def pair(kind: str) -> tuple[Alignment, Evaluator]:
    """A path of tiny ViTs (canonical, heads as circuits) or of tiny GPT-2s as given (tied heads)."""
    if kind == "vit_circuits":
        alignment = Alignment(to_canonical(tiny_vit(0)), to_canonical(tiny_vit(1)), circuits=("qk", "vo"))
        return alignment, Evaluator(images(), progress=False)
    return Alignment(tiny_gpt2(0), tiny_gpt2(1)), Evaluator(tokens(), "causal_lm", progress=False)


@pytest.mark.parametrize("kind", ["vit_circuits", "gpt2_original"])
def test_no_part_is_the_held_end_and_every_part_is_the_straight_line(kind):
    alignment, evaluator = pair(kind)
    paths = PartPaths(evaluator, alignment)
    loss_a, loss_b = evaluator.evaluate(alignment.reference)[0], evaluator.evaluate(alignment.model)[0]
    assert [paths.loss([], lam, "a") for lam in LAMBDAS] == [loss_a] * len(LAMBDAS)
    assert [paths.loss([], lam, "b") for lam in LAMBDAS] == [loss_b] * len(LAMBDAS)
    line = evaluator.path(alignment, LAMBDAS)["loss"]
    record = layerwise_barriers(evaluator, alignment, LAMBDAS, cumulative=True)
    assert record["parts"] == ["embed", "block 0", "block 1", "head"]
    for held in ("held_at_a", "held_at_b"):  # parts 0..last: every part, whichever end the rest was held at
        assert record["cumulative"][held]["loss"][-1] == line  # the same floats, not merely close
        assert record["cumulative"][held]["loss"][0] == record[held]["loss"][0]  # parts 0..0: the embedding
    assert record["held_at_a"]["loss"][1][-1] == loss_a and record["held_at_b"]["loss"][1][0] == loss_b
    assert max(record["held_at_a"]["barrier"]) > 0  # the tiny random pair has barriers somewhere
    json.dumps(record)  # a plain record for results.json


def test_a_difference_in_one_block_shows_only_there():
    a, other = to_canonical(tiny_vit(0)), to_canonical(tiny_vit(1))
    params = a.params()
    params.update({k: v for k, v in other.params().items() if k.startswith("blocks.1.")})
    b = CanonicalTransformer(a.config, params)
    evaluator, alignment = Evaluator(images(), progress=False), Alignment(a, b)
    record = layerwise_barriers(evaluator, alignment, LAMBDAS)
    line = evaluator.path(alignment, LAMBDAS)["loss"]
    one = record["parts"].index("block 1")
    for held, end in (("held_at_a", alignment.reference), ("held_at_b", b)):
        own = evaluator.evaluate(end)[0]
        for i, losses in enumerate(record[held]["loss"]):
            if i == one:  # the only part that differs: its curve is the whole path's
                assert losses == pytest.approx(line, rel=1e-5) and len(set(losses)) > 1
            else:  # A's and B's tensors agree: the loss stays at the held end's
                assert losses == pytest.approx([own] * len(LAMBDAS), rel=1e-6)
                assert record[held]["barrier"][i] == pytest.approx(0.0, abs=1e-6)


def test_original_models_are_grouped_by_module_path():
    vit = tensor_parts(Functional(tiny_vit(0), torch.device("cpu")))
    assert vit["vit.embeddings.position_embeddings"] == vit["vit.embeddings.cls_token"] == "embed"
    assert vit["vit.layers.1.mlp.fc2.weight"] == "block 1"
    assert vit["vit.layernorm.weight"] == vit["classifier.bias"] == "head"  # after the last block
    gpt2 = tensor_parts(Functional(tiny_gpt2(0), torch.device("cpu")))
    assert gpt2["transformer.wte.weight"] == "embed" and "lm_head.weight" not in gpt2  # tied: with its embedding
    assert gpt2["transformer.ln_f.weight"] == "head" and gpt2["transformer.h.0.attn.c_attn.weight"] == "block 0"


def test_the_api_checks_its_inputs_and_names_what_is_wrong():
    a, b = tiny_vit(0), tiny_vit(1)
    record = glmc.evaluate_layerwise(a, b, images(), [0.0, 0.5, 1.0], progress=False)
    assert record["parts"] == ["embed", "block 0", "block 1", "head"] and record["cumulative"] is None
    assert len(record["held_at_b"]["loss"]) == 4 and all(len(row) == 3 for row in record["held_at_b"]["loss"])
    with pytest.raises(ValueError, match=r"lambdas\[1\]"):
        glmc.evaluate_layerwise(a, b, images(), [0.0, 2.0], progress=False)
    paths = PartPaths(Evaluator(images(), progress=False), Alignment(a, b))
    with pytest.raises(ValueError, match="block 7"):
        paths.loss(["block 7"], 0.5)
    with pytest.raises(ValueError, match="held='c'"):
        paths.loss(["head"], 0.5, held="c")


def test_a_run_writes_the_record_the_figures_and_the_table(monkeypatch, capsys, tmp_path, tiny_overrides):
    from conftest import run_script

    run_dir = tmp_path / "run"
    args = [*tiny_overrides, "matcher.methods=[vanilla,weight]", "eval.layerwise=single", f"hydra.run.dir={run_dir}"]
    code, _, err = run_script(monkeypatch, capsys, *args)
    assert code == 0, err[-2000:]
    results = json.loads((run_dir / "results.json").read_text())
    for method in ("vanilla", "weight"):
        record = results["methods"][method]["pairs"][0]["layerwise"]
        assert record["parts"] == ["embed", "block 0", "head"] and record["cumulative"] is None
        assert len(record["held_at_a"]["barrier"]) == 3 and (run_dir / record["figure"]).stat().st_size > 0
        assert record["figure"] == f"{method}/layerwise_0-1.png"
    assert (run_dir / "layerwise.png").stat().st_size > 0
    rows = (run_dir / "layerwise.csv").read_text().splitlines()
    assert rows[0].startswith("method,pair,kind,held_at,part,barrier") and len(rows) == 1 + 2 * 2 * 3


def test_the_run_table_averages_pairs_and_logs_lines_and_the_figure(tmp_path):
    from glmc.pipeline.layerwise_run import write_layerwise

    def record(scale):
        curves = {"barrier": [0.0, scale, 2 * scale], "loss": [[1.0, 1.0]] * 3}
        return {"parts": ["embed", "block 0", "head"], "lambdas": [0.0, 1.0], "held_at_a": curves,
                "held_at_b": curves, "cumulative": None}  # fmt: skip

    pairs = [{"seeds": [0, 1], "layerwise": record(1.0)}, {"seeds": [2, 3], "layerwise": record(3.0)}]
    results = {"model": "m", "dataset": "d", "methods": {"weight": {"pairs": pairs}, "vanilla": {"pairs": [{}]}}}

    class Tracker:
        logged: list = []

        def log_image(self, key, path):
            self.logged.append((key, path.name))

        def log_lines(self, key, xs, lines, xname):
            self.logged.append((key, xs, lines))

    tracker = Tracker()
    assert [f.name for f in write_layerwise(results, tmp_path, tracker)] == ["layerwise.png", "layerwise.csv"]
    assert ("layerwise/png", "layerwise.png") in tracker.logged
    assert ("layerwise/barrier_held_at_a", [0, 1, 2], {"weight": [0.0, 2.0, 4.0]}) in tracker.logged  # pairs' mean
    assert len((tmp_path / "layerwise.csv").read_text().splitlines()) == 1 + 2 * 2 * 3
    assert write_layerwise({"methods": {"vanilla": {"pairs": [{}]}}}, tmp_path, tracker) == []  # none asked for


def test_an_unknown_layerwise_setting_is_refused_before_any_work():
    from omegaconf import OmegaConf

    from glmc.pipeline.validate import ConfigError, validate_config

    from conftest import compose_config

    cfg = compose_config("debug=fast")
    OmegaConf.update(cfg, "eval.layerwise", "blocks")
    with pytest.raises(ConfigError, match="eval.layerwise=blocks: choose one of none, single, cumulative"):
        validate_config(cfg)
