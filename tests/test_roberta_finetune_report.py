"""The roberta_finetune artefact (paper 002's Table 1 at CPU size) end to end from tiny runs, its
macro-F1 against a hand computation, and the children source refusing a run without a parent before any
training."""

from __future__ import annotations

import contextlib
import csv
import io
import math

import pytest
from test_reproduce import reproduce, run_in_this_process

from glmc.pipeline.children import get_children, macro_f1
from glmc.report import roberta_finetune as rf

from conftest import compose_config


def in_percent(cell: str) -> bool:
    return cell != "" and math.isfinite(float(cell)) and 0.0 <= float(cell) <= 100.0


@pytest.mark.slow
def test_tiny_artefact_has_every_row_and_column_with_scores_in_percent(tmp_path, monkeypatch):
    args = ["roberta_finetune", "--tiny", "--root", str(tmp_path / "runs"), "--out", str(tmp_path / "report")]
    args += ["--set", f"cache_dir={tmp_path / 'endpoints'}", "--set", "logger=none"]
    monkeypatch.setattr(reproduce, "run_command", run_in_this_process)  # no new interpreter per step
    with contextlib.redirect_stdout(io.StringIO()):
        reproduce.main(args)
    out = tmp_path / "report" / "roberta_finetune"
    rows = list(csv.DictReader((out / "roberta_finetune.csv").open()))
    cells = {(r["pair_kind"], r["scope"], r["matching"], r["merge"]) for r in rows}
    assert cells == {(k, s, m, g) for k in rf.KINDS for s, m in rf.ROWS for g in rf.MERGES}
    assert len(rows) == len(cells)
    for row in rows:
        # --tiny: seeds 0 and 1, so 3 datasets x 1 seed pair, and 3 dataset pairs x 2 seeds
        assert row["pairs"] == {"same": "3", "cross": "6"}[row["pair_kind"]]
        assert all(in_percent(row[k]) for k in ("macro_f1", "accuracy")), row
        assert all(math.isfinite(float(row[k])) for k in ("macro_f1_se", "accuracy_se")), row
    pairs = list(csv.DictReader((out / "roberta_finetune_pairs.csv").open()))
    assert len(pairs) == (3 + 6) * len(rf.ROWS) * len(rf.MERGES)
    table = (out / "roberta_finetune.md").read_text()
    header = table.splitlines()[0]
    for kind in rf.KINDS.values():
        for merge in rf.MERGES.values():
            assert f"| {kind}: {merge} |" in header
    for scope, matching in rf.ROWS:
        line = next(x for x in table.splitlines() if x.startswith("| " + " | ".join(rf.row_label(scope, matching))))
        numbers = [c.split(" ± ")[0] for c in line.strip("|").split("|")[2:-1]]
        assert len(numbers) == 6 and all(in_percent(c) for c in numbers), line
    section = (out / "section.md").read_text()
    assert section.count("(a) matching") == 4 and section.count("(b) rotation + rescaling") == 4
    assert "](roberta_finetune.csv)" in section and "--tiny" in section


@pytest.mark.numeric
def test_macro_f1_matches_a_hand_computation():
    # class 0: TP 1, FP 1, FN 1 -> 1/2; class 1: TP 2, FP 1 -> 4/5; class 2: FN 1 -> 0; class 3: TP 1 -> 1
    assert macro_f1([0, 1, 1, 1, 0, 3], [0, 0, 1, 1, 2, 3]) == pytest.approx((0.5 + 0.8 + 0.0 + 1.0) / 4)
    # classes 2 and 3 occur in neither: skipped, not counted as 0 (which would give 1/3)
    assert macro_f1([0, 1, 1], [0, 0, 1]) == pytest.approx(2 / 3)
    assert macro_f1([2, 2], [2, 2]) == 1.0
    with pytest.raises(ValueError, match="3 predictions for 2 labels"):
        macro_f1([0, 1, 1], [0, 1])


def test_children_without_a_parent_are_refused_naming_the_setting_before_anything_is_written(tmp_path):
    cfg = compose_config("experiment=roberta_finetune", "debug=fast", *rf.TINY, f"cache_dir={tmp_path}", "logger=none")
    cfg.pretrain.enabled = False
    with pytest.raises(ValueError, match="from a parent.*set pretrain.enabled=true"):
        get_children(cfg, tmp_path / "run", tracker=None)
    assert not list(tmp_path.iterdir())  # nothing trained, nothing written
