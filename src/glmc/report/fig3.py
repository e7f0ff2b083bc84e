"""Paper 001 Fig. 3: loss (and accuracy or perplexity) along the path per method, mean ± s.e. over the
seed pairs, one column per task; read from the Table 2 runs."""

from __future__ import annotations

from pathlib import Path

from glmc.report.artefact import Artefact
from glmc.report.band_grid import Panel, plot_band_grid
from glmc.report.results import barrier_stats, curve, second_metric
from glmc.report.section import write_section
from glmc.report.table2 import DIGITS_STEP, TEXT_STEP, task_runs
from glmc.report.tables import mean_pm


def make(root: Path, out: Path) -> list[Path]:
    out = Path(out)
    columns = []
    for task, results in task_runs(root):
        key, ylabel, scale = second_metric(results["task"])
        loss, second = [], []
        for method, m in results["methods"].items():
            s = barrier_stats(m["pairs"])
            label = f"{method} ({mean_pm(s['barrier'], s['barrier_se'], 2)})"
            loss.append(curve(m["pairs"], "test_loss", label, method))
            second.append(curve(m["pairs"], key, label, method, scale))
        n = len(next(iter(results["methods"].values()))["pairs"])
        title = f"{task}: {results['model']} on {results['dataset']}, {n} pairs"
        columns.append([Panel(title, "test loss (nats)", loss), Panel(title, ylabel, second)])
    figure = plot_band_grid(columns, out / "fig3.png")
    body = (
        "![Fig. 3: loss and accuracy / perplexity along the path per method](fig3.png)\n\n"
        "Mean over the disjoint seed pairs, band ± one standard error; the legend gives each method's "
        "barrier (nats). λ = 1 is the first model of each pair, λ = 0 the second (aligned) one."
    )
    return [figure, write_section(ARTEFACT, out, body)]


ARTEFACT = Artefact("fig3", "Fig. 3: loss along the interpolation path per method", (DIGITS_STEP, TEXT_STEP), make)
