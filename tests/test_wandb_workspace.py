"""The W&B workspace of barrier curves is built, written as JSON and read back offline."""

from __future__ import annotations

import json

import pytest

from glmc.pipeline import tracking
from glmc.pipeline.workspace import JOB_TYPES, KIND, build_workspace, workspace_from_json, workspace_json

from conftest import load_script


def _names(metrics) -> list[str]:
    return [m if isinstance(m, str) else m.name for m in metrics]


def _panels(workspace) -> dict[str, dict[str, object]]:
    """Per section: panel title -> (type, x, y metrics, group key, aggregation, band)."""
    return {
        section.name: {
            p.title: (
                type(p).__name__,
                _names([p.x])[0] if hasattr(p, "x") else None,
                _names(p.y if hasattr(p, "y") else p.metrics),
                p.groupby.name if p.groupby is not None else None,
                p.groupby_aggfunc,
                p.groupby_rangefunc,
            )
            for p in section.panels
        }
        for section in workspace.sections
    }


EXPECTED = {
    "barrier curves": {
        "test loss along the path": ("LinePlot", "curve/lambda", ["curve/test_loss"], "method", "mean", "stderr"),
        "test accuracy along the path": (
            "LinePlot",
            "curve/lambda",
            ["curve/test_accuracy"],
            "method",
            "mean",
            "stderr",
        ),
        "barrier per method": ("BarPlot", None, ["barrier"], "method", "mean", "stderr"),
        "barrier_vs_mean per method": ("BarPlot", None, ["barrier_vs_mean"], "method", "mean", "stderr"),
    },
    "endpoint training": {
        key: ("LinePlot", "trainer/global_step", [key], None, None, None)
        for key in ("train_loss", "val_loss", "val_acc")
    },
    "learned matching": {"match_loss": ("LinePlot", "trainer/global_step", ["match_loss"], None, None, None)},
}


def _view_panels(document: dict) -> dict[str, list[dict]]:
    """The panel configs of each section in the JSON the W&B app reads."""
    sections = document["view"]["spec"]["section"]["panelBankConfig"]["sections"]
    return {s["name"]: [p["config"] for p in s["panels"]] for s in sections}


def test_workspace_panels_and_run_set():
    workspace = build_workspace("team", "glmc", group="sweep_a")
    assert (workspace.entity, workspace.project, workspace.name) == ("team", "glmc", "barrier curves: sweep_a")
    assert _panels(workspace) == EXPECTED
    assert [s.is_open for s in workspace.sections] == [True, True, False]
    # one run set for every section: curve, train and match runs of the group, no evaluate runs
    filters = workspace.runset_settings.filters
    assert "JobType" in filters and "'sweep_a'" in filters and "evaluate" not in filters
    assert tracking.CURVE in JOB_TYPES and set(JOB_TYPES) == {"curve", "train", "match"}
    assert not workspace.runset_settings.groupby  # grouping is per panel: endpoints stay one line per seed
    assert "Group" not in build_workspace("team", "glmc").runset_settings.filters


def test_workspace_json_round_trip(tmp_path):
    workspace = build_workspace("team", "glmc", group="sweep_a")
    path = tmp_path / "workspace.json"
    path.write_text(json.dumps(workspace_json(workspace)))
    document = json.loads(path.read_text())
    assert document["kind"] == KIND and document["view"]["entity"] == "team"

    panels = _view_panels(document)
    loss, accuracy, *bars = panels["barrier curves"]
    for config, metric in ((loss, "curve/test_loss"), (accuracy, "curve/test_accuracy")):
        assert (config["xAxis"], config["metrics"]) == ("curve/lambda", [metric])
        # a config key groups as "<key>.value"; aggregate draws the mean line with a band
        assert (config["groupBy"], config["groupAgg"], config["groupArea"], config["aggregate"]) == (
            "method.value",
            "mean",
            "stderr",
            True,
        )
    assert [b["metrics"] for b in bars] == [["barrier"], ["barrier_vs_mean"]]
    assert [(c["xAxis"], c["metrics"]) for c in panels["endpoint training"]] == [
        ("trainer/global_step", [key]) for key in ("train_loss", "val_loss", "val_acc")
    ]
    assert [c["metrics"] for c in panels["learned matching"]] == [["match_loss"]]
    assert all("groupBy" not in c for c in panels["endpoint training"] + panels["learned matching"])
    (run_set,) = document["view"]["spec"]["section"]["runSets"]
    assert {(f["key"]["name"], f["op"], json.dumps(f["value"])) for f in run_set["filters"]["filters"]} == {
        ("jobType", "IN", json.dumps(list(JOB_TYPES))),
        ("group", "=", '"sweep_a"'),
    }

    back = workspace_from_json(document)
    assert _panels(back) == EXPECTED
    assert (back.entity, back.project, back.name) == ("team", "glmc", "barrier curves: sweep_a")
    assert back.runset_settings.filters == workspace.runset_settings.filters
    assert workspace_json(back) == document


def test_foreign_json_is_refused():
    with pytest.raises(ValueError, match="not a workspace document"):
        workspace_from_json({"view": {}})


def test_command_writes_the_definition(tmp_path, capsys):
    out = tmp_path / "ws" / "curves.json"
    command = load_script("experiments/wandb_workspace.py")
    args = ["--entity", "team", "--project", "glmc"]
    command.main([*args, "--group", "debug", "--json", str(out)])
    document = json.loads(out.read_text())
    back = workspace_from_json(document)
    assert _panels(back) == EXPECTED and back.name == "barrier curves: debug"
    capsys.readouterr()
    command.main(args)  # no --json and no --save: the definition goes to stdout
    assert json.loads(capsys.readouterr().out)["view"]["displayName"] == "barrier curves"
