"""eval.layerwise in a run: each method's and pair's layer-wise barriers (glmc.eval.layerwise) in its record,
a part x lambda heatmap in the method's folder (layerwise_<pair>.png), and for the run a part x method
heatmap of the barriers (layerwise.png, mean over pairs), layerwise.csv, and both logged to W&B."""

from __future__ import annotations

import csv
import io
import logging
from pathlib import Path
from typing import Any

import numpy as np

from glmc.eval.layerwise import HELD, layerwise_barriers
from glmc.eval.layerwise_plot import HELD_TITLES, plot_heatmaps, plot_layerwise
from glmc.safe_files import atomic_write_text

log = logging.getLogger(__name__)


def layerwise_record(run: Any, name: str, label: str, alignment: Any, pair: tuple) -> dict[str, Any]:
    """The pair's layer-wise barriers under method `name` (eval.layerwise=single|cumulative), its figure
    written beside the method's other files."""
    cumulative = str(run.cfg.eval.layerwise) == "cumulative"
    record = layerwise_barriers(run.evaluator, alignment, run.lambdas, cumulative, desc=f"{name} {label} layer-wise")
    folder = Path(run.run_dir) / name
    folder.mkdir(parents=True, exist_ok=True)
    figure = plot_layerwise(folder / f"layerwise_{label}.png", record, f"{name} {label}: layer-wise barriers")
    record["figure"] = str(figure.relative_to(run.run_dir))
    return record


def layerwise_table(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Method -> {"parts", "held_at_a"/"held_at_b": mean barrier per part over the method's pairs}, for
    the methods whose pairs have layer-wise records."""
    table = {}
    for method, summary in results.get("methods", {}).items():
        records = [p["layerwise"] for p in summary.get("pairs") or [summary] if p.get("layerwise")]
        if records:
            table[method] = {
                "parts": records[0]["parts"],
                **{
                    f"held_at_{h}": np.mean([r[f"held_at_{h}"]["barrier"] for r in records], axis=0).tolist()
                    for h in HELD
                },
            }
    return table


def layerwise_csv(results: dict[str, Any]) -> str:
    """One row per method, pair, held end, part (and cumulative prefix): the barrier and the losses."""
    out = io.StringIO()
    writer = csv.writer(out)
    header = False
    for method, summary in results.get("methods", {}).items():
        for pair in summary.get("pairs") or [summary]:
            record = pair.get("layerwise")
            if not record:
                continue
            if not header:
                writer.writerow(["method", "pair", "kind", "held_at", "part", "barrier", *record["lambdas"]])
                header = True
            seeds = "-".join(str(s) for s in pair.get("endpoints") or pair.get("seeds") or [])
            for kind, source in (("single", record), ("cumulative", record.get("cumulative") or {})):
                for h in HELD:
                    if f"held_at_{h}" in source:
                        curves = source[f"held_at_{h}"]
                        for part, b, losses in zip(record["parts"], curves["barrier"], curves["loss"]):
                            writer.writerow([method, seeds, kind, h.upper(), part, b, *losses])
    return out.getvalue()


def write_layerwise(results: dict[str, Any], run_dir: Path, tracker: Any) -> list[Path]:
    """layerwise.png (part x method, mean barrier over pairs) and layerwise.csv where the run's records
    have layer-wise barriers; with W&B, the figure and each method's barrier per part as lines."""
    table = layerwise_table(results)
    if not table:
        return []
    parts = max((t["parts"] for t in table.values()), key=len)
    panels = {}
    for h in HELD:
        rows = [
            [t[f"held_at_{h}"][t["parts"].index(p)] if p in t["parts"] else None for t in table.values()] for p in parts
        ]
        panels[HELD_TITLES[f"held_at_{h}"]] = (parts, list(table), rows)
    title = f"{results.get('model', '')} on {results.get('dataset', '')}: layer-wise barriers"
    files = [plot_heatmaps(Path(run_dir) / "layerwise.png", panels, "barrier (mean over pairs)", title=title)]
    files.append(Path(run_dir) / "layerwise.csv")
    atomic_write_text(files[-1], layerwise_csv(results))
    tracker.log_image("layerwise/png", files[0])
    for h in HELD:
        lines = {m: t[f"held_at_{h}"] for m, t in table.items() if t["parts"] == parts}
        tracker.log_lines(f"layerwise/barrier_held_at_{h}", list(range(len(parts))), lines, "part (0 = embed)")
    log.info("wrote %s", ", ".join(str(f) for f in files))
    return files
