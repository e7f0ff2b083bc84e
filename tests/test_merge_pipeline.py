"""Merges and the HF export inside a run: results.json rows, the printed table, exported folders."""

from __future__ import annotations

import json
import math

from transformers import ViTForImageClassification

from glmc.pipeline.run import run_pipeline

from conftest import compose_config
from numeric import FORWARD


def test_run_reports_merges_and_exports_factored_midpoints(tmp_path, tiny_overrides, capsys):
    cfg = compose_config(
        *tiny_overrides,
        # every training image: on these endpoints activation_orth's map keeps the stream mean-zero and
        # its merge exports (on others it may not: the export then refuses, naming why)
        "data.val_fraction=0",
        "merge=all",
        "merge.batches=2",
        "merge.export=true",
        "matcher.methods=[vanilla,weight,rotation,activation,activation_orth]",
        "matcher.activation.batches=2",
    )
    run_pipeline(cfg, tmp_path / "run")
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    for name, method in saved["methods"].items():
        # on trained endpoints every new matcher keeps B's function
        assert method["pairs"][0]["function_preserving"], name
        assert method["pairs"][0]["endpoint_deviation"] < FORWARD, name
        assert set(method["merges"]) == {"fisher", "regmean"}, name
        for merge in method["merges"].values():
            assert math.isfinite(merge["test_loss"]) and 0.0 <= merge["test_accuracy"] <= 1.0
        export = method["pairs"][0]["export"]
        if name == "weight":  # circuit interpolation: no HF shape, said so instead of failing
            assert not export["exported"] and "circuit" in export["reason"]
        else:
            assert export["exported"] and export["relative_deviation"] < FORWARD, name
            loaded = ViTForImageClassification.from_pretrained(export["path"])
            assert loaded.config.hidden_size == cfg.model.hidden_size
    # rotation evaluates its ablations beside the full method
    pair = saved["methods"]["rotation"]["pairs"][0]
    assert {"permutation_only", "no_rescale"} <= set(pair)
    printed = capsys.readouterr().out
    assert "midpoint merges" in printed and "regmean" in printed
