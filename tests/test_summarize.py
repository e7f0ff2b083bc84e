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


def test_rows_differ_by_every_differing_setting_and_failed_jobs_are_listed(tmp_path, monkeypatch, capsys):
    from glmc.pipeline.sweep_report import record_failed_job

    for job, seq_len, barrier in ((0, 32, 1.0), (2, 64, 3.0)):
        run = tmp_path / f"{job}_data.seq_len={seq_len}"
        (run / ".hydra").mkdir(parents=True)
        results = _results([0, 1], {"vanilla": 4.0, "weight": barrier})
        results["config"] = {"seeds": [0, 1], "threads": job, "data": {"seq_len": seq_len}}
        (run / "results.json").write_text(json.dumps(results))
    failed = tmp_path / "1_data.seq_len=999"
    (failed / ".hydra").mkdir(parents=True)
    record_failed_job(failed, 1, ["data.seq_len=999"], "data.seq_len=999 is longer than the model's 128 positions")
    monkeypatch.setattr(sys, "argv", ["summarize.py", str(tmp_path)])
    load_script("experiments/summarize.py").main()
    printed = capsys.readouterr().out
    weight = [line for line in printed.splitlines() if line.startswith("| e | m | d | weight |")]
    # one row per length, each with its own pair; threads changes no number and splits nothing
    assert len(weight) == 2
    assert "| data.seq_len=32 | 1 | 1.000 | 0.250 |" in weight[0]
    assert "| data.seq_len=64 | 1 | 3.000 | 0.750 |" in weight[1]
    assert "1 jobs without results:" in printed
    assert "1_data.seq_len=999: failed: data.seq_len=999 is longer" in printed
