"""Where connectivity breaks, per method and pair, beside the straight line: the barrier layer by layer
(eval.layerwise: glmc.pipeline.layerwise_run), a trained curve between the ends (curve=bezier|chain:
glmc.pipeline.curve_run) and the loss over the plane through three models (eval.plane.enabled:
glmc.pipeline.plane_run); and lm-evaluation-harness's task scores along the path (eval.tasks:
glmc.pipeline.tasks_run). Each adds its record to the pair's entry in results.json under its own key."""

from __future__ import annotations

from typing import Any


def landscape_records(run: Any, name: str, label: str, alignment: Any, pair: tuple, context: Any) -> dict[str, Any]:
    """The records the run's settings ask for, for method `name`'s alignment of the pair `label`."""
    cfg, out = run.cfg, {}
    if str(cfg.eval.layerwise) != "none":
        from glmc.pipeline.layerwise_run import layerwise_record

        out["layerwise"] = layerwise_record(run, name, label, alignment, pair)
    if str(cfg.curve.name) != "none" and name in cfg.curve.methods:
        from glmc.pipeline.curve_run import curve_record

        out["curve"] = curve_record(run, name, label, alignment, pair, context)
    if cfg.eval.plane.enabled:
        from glmc.pipeline.plane_run import plane_record

        out["plane"] = plane_record(run, name, label, alignment, pair)
    if cfg.eval.tasks:
        from glmc.pipeline.tasks_run import task_record

        out["tasks"] = task_record(run, name, label, alignment, pair)
    return out


def landscape_outputs(results: dict[str, Any], run_dir: Any, tracker: Any) -> None:
    """The run's own figures and tables of these records (call after tracker.log_results)."""
    if str(results.get("config", {}).get("eval", {}).get("layerwise", "none")) != "none":
        from glmc.pipeline.layerwise_run import write_layerwise

        write_layerwise(results, run_dir, tracker)
    if results.get("tasks"):
        from glmc.pipeline.tasks_run import write_tasks

        write_tasks(results, run_dir, tracker)
