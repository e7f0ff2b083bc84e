"""experiments/summarize.py pools seed pairs across the runs of a sweep."""

from __future__ import annotations

import json
import sys

from conftest import load_script


def _results(seeds, barriers):
    pair = lambda b: {
        "seeds": seeds,
        "barrier": b,
        "barrier_vs_mean": b,
        "lambdas": [0.0, 1.0],
        "test_loss": [0.1, 0.1],
        "test_accuracy": [0.9, 0.9],
    }
    return {
        "experiment": "e",
        "model": "m",
        "dataset": "d",
        "methods": {name: {"pairs": [pair(b)]} for name, b in barriers.items()},
    }


def test_pairs_pool_across_runs(tmp_path, monkeypatch, capsys):
    for i, seeds in enumerate(([0, 1], [2, 3], [0, 1])):  # the last run repeats a pair
        run = tmp_path / str(i)
        run.mkdir()
        (run / "results.json").write_text(json.dumps(_results(seeds, {"vanilla": 2.0 + i, "weight": 1.0})))
    monkeypatch.setattr(sys, "argv", ["summarize.py", str(tmp_path)])
    load_script("experiments/summarize.py").main()
    printed = capsys.readouterr().out
    rows = {line.split("|")[4].strip(): line for line in printed.splitlines() if line.startswith("| e ")}
    # vanilla pairs: (0,1) -> 4.0 (the later run wins), (2,3) -> 3.0; weight: 1.0 twice
    assert "| 2 | 3.500 ± 0.500 |" in rows["vanilla"]
    assert "0.286" in rows["weight"]  # 1.0 / 3.5
    assert (tmp_path / "summary.png").exists() and (tmp_path / "summary.md").exists()
