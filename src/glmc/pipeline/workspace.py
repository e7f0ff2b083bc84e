"""A W&B workspace for the runs `logger=wandb` writes (see glmc.pipeline.tracking).

Three sections:

    barrier curves     curve/test_loss and curve/test_accuracy against curve/lambda, one line per
                       config `method` (mean over its seed pairs, with a band), and the barriers per method
    endpoint training  train_loss, val_loss, val_acc against trainer/global_step, one line per endpoint
    learned matching   match_loss against trainer/global_step, one line per method and pair

A workspace has one run set for all of its sections, so job types cannot be filtered per section: the
run set holds the curve, train and match runs (of one group when a group is given) and leaves out the
evaluate runs; each section plots keys that only one job type logs (curve/* only curve runs,
train_loss/val_loss/val_acc only endpoints, match_loss only learned matching), so the curve panels
draw curve runs alone.

`workspace_json` and `workspace_from_json` turn a workspace into a JSON document and back without
network; `Workspace.save()` needs a W&B login.
"""

from __future__ import annotations

from importlib.metadata import version
from typing import Any

import wandb_workspaces.reports.v2 as wr
import wandb_workspaces.workspaces as ws
from wandb_workspaces.workspaces import internal

LAMBDA = "curve/lambda"
STEP = "trainer/global_step"
# job types of glmc.pipeline.tracking, spelled out: importing it would load Lightning for a CLI
JOB_TYPES = ("curve", "train", "match")
BAND = "stderr"  # the band around a method's mean curve: standard error over its seed pairs
MAX_RUNS = 50  # lines (or groups) per panel: a sweep's endpoints and pairs, not only W&B's first 10
KIND = "wandb-workspace"  # marks the JSON documents this module writes


def _by_method(**kwargs: Any) -> dict[str, Any]:
    """Panel arguments that aggregate the runs of one method: mean line and a band."""
    return dict(groupby=wr.Config("method"), groupby_aggfunc="mean", groupby_rangefunc=BAND, **kwargs)


def curve_section() -> ws.Section:
    curves = [
        wr.LinePlot(
            title=f"test {metric} along the path",
            x=LAMBDA,
            y=[f"curve/test_{metric}"],
            title_x="lambda",
            title_y=f"test {metric}",
            **_by_method(),
        )
        for metric in ("loss", "accuracy")
    ]
    barriers = [
        wr.BarPlot(title=f"{key} per method", metrics=[key], title_x=key, **_by_method())
        for key in ("barrier", "barrier_vs_mean")
    ]
    return ws.Section(
        name="barrier curves",
        panels=[*curves, *barriers],
        is_open=True,
        # panels added to this section by hand start on the λ axis too
        panel_settings=ws.SectionPanelSettings(x_axis=LAMBDA),
    )


def _training_section(name: str, keys: list[str], is_open: bool) -> ws.Section:
    return ws.Section(
        name=name,
        panels=[wr.LinePlot(title=key, x=STEP, y=[key], title_x="step") for key in keys],
        is_open=is_open,
        panel_settings=ws.SectionPanelSettings(x_axis=STEP),
    )


def build_workspace(entity: str, project: str, group: str | None = None, name: str | None = None) -> ws.Workspace:
    """The workspace of `entity/project`, restricted to the runs of W&B group `group` when given
    (`logger.group`, by default the experiment's name); unsaved."""
    filters = [ws.Metric("JobType").isin(list(JOB_TYPES))]
    if group:
        filters.append(ws.Metric("Group") == group)
    return ws.Workspace(
        entity=entity,
        project=project,
        name=name or (f"barrier curves: {group}" if group else "barrier curves"),
        sections=[
            curve_section(),
            _training_section("endpoint training", ["train_loss", "val_loss", "val_acc"], is_open=True),
            _training_section("learned matching", ["match_loss"], is_open=False),
        ],
        settings=ws.WorkspaceSettings(max_runs=MAX_RUNS),
        runset_settings=ws.RunsetSettings(
            filters=filters,
            pinned_columns=["config:method", "config:seeds", "summary:barrier", "summary:barrier_vs_mean"],
        ),
    )


# wandb_workspaces has no public (de)serialiser: these go through the view model that save() uploads
# and that a loaded view is built from (constraints.txt pins the version they were written against).


def workspace_json(workspace: ws.Workspace) -> dict[str, Any]:
    """A JSON-ready document: the W&B view spec of `workspace` and the library version that wrote it."""
    view = workspace._to_model().model_dump(mode="json", by_alias=True, exclude_none=True)
    return {"kind": KIND, "wandb_workspaces": version("wandb-workspaces"), "view": view}


def workspace_from_json(document: dict[str, Any]) -> ws.Workspace:
    """The workspace of a document `workspace_json` wrote."""
    if document.get("kind") != KIND:
        raise ValueError(f"not a workspace document (kind={document.get('kind')!r}, expected {KIND!r})")
    return ws.Workspace._from_model(internal.View.model_validate(document["view"]))
