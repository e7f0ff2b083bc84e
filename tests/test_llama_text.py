"""experiment=llama_text end to end at tiny size (grouped-query rotary Llamas through training, every
matcher and the paths) from the artefact's --tiny run, and the verdict lines from known numbers."""

from __future__ import annotations

import contextlib
import csv
import io
import math

import pytest
from test_reproduce import reproduce, run_in_this_process

from glmc.report import llama_text


@pytest.mark.slow
def test_tiny_artefact_runs_every_matcher_on_llama(tmp_path, monkeypatch):
    args = ["llama_text", "--tiny", "--root", str(tmp_path / "runs"), "--out", str(tmp_path / "report")]
    args += ["--set", f"cache_dir={tmp_path / 'endpoints'}", "--set", "logger=none"]
    monkeypatch.setattr(reproduce, "run_command", run_in_this_process)
    with contextlib.redirect_stdout(io.StringIO()):
        reproduce.main(args)
    out = tmp_path / "report" / "llama_text"
    rows = {r["method"]: r for r in csv.DictReader((out / "llama_text.csv").open())}
    assert list(rows) == list(llama_text.METHODS)  # the factored rows from the second step
    for method, row in rows.items():
        assert row["pairs"] == "1" and math.isfinite(float(row["barrier"])), method
    section = (out / "section.md").read_text()
    assert "weight / vanilla:" in section and "learned:" in section and "--tiny" in section


def test_verdict_counts_the_pairs_that_meet_each_target():
    per_pair = {"vanilla": [1.0, 1.0, 0.5], "weight": [0.3, 0.4, 0.1], "learned": [0.04, 0.06, 0.05]}
    stats = {m: {"barrier": sum(v) / len(v)} for m, v in per_pair.items()}
    weight, learned = llama_text.verdict(stats, per_pair)
    assert weight.startswith("weight / vanilla: 0.32 on the mean") and weight.endswith("met on 2 of 3")
    assert "0.30, 0.40, 0.20 per pair" in weight
    assert learned.startswith("learned: 0.050 nats on the mean") and learned.endswith("met on 2 of 3 pairs")
