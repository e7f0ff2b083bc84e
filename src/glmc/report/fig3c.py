"""Paper 001 Fig. 3c: a wide ViT against narrower ones embedded into its shapes (experiment=digits_hetero);
one line per (method, narrow width) and a table of their barriers."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from glmc.report.artefact import Artefact, Step
from glmc.report.band_grid import Panel, plot_band_grid
from glmc.report.results import barrier_stats, curve, run_results, second_metric
from glmc.report.section import write_section
from glmc.report.tables import markdown, mean_pm, seconds, write_csv

# --tiny: widths 8 and 12 against debug=fast's width 16; width 8 twice, so its lines get a band
NARROW = "{hidden_size:8,num_heads:1,mlp_size:16}"
STEP = Step(
    label="fig3c_hetero",
    overrides=("experiment=digits_hetero",),
    tiny=(
        "seeds=[0,1,2,3]",
        f"endpoint_models=[{{}},{NARROW},{{hidden_size:12,num_heads:2,mlp_size:24}},{NARROW}]",
        "matcher.learned.max_steps=5",
    ),
)


def make(root: Path, out: Path) -> list[Path]:
    out = Path(out)
    results = run_results(Path(root) / STEP.label)
    width = {e["seed"]: e["width"] for e in results["endpoints"]}
    wide = results["endpoints"][0]
    key, ylabel, scale = second_metric(results["task"])
    loss, second, rows, csv_rows = [], [], [], []
    for method, m in results["methods"].items():
        by_width = defaultdict(list)  # pairs (wide seed, narrow seed) grouped by the narrow model's width
        for pair in m["pairs"]:
            by_width[width[pair["seeds"][1]]].append(pair)
        for w, pairs in sorted(by_width.items()):
            s = barrier_stats(pairs)
            label = f"{method}, width {w} ({mean_pm(s['barrier'], s['barrier_se'], 3)})"
            loss.append(curve(pairs, "test_loss", label, method))
            second.append(curve(pairs, key, label, method, scale))
            rows.append(
                [method, str(w), str(s["pairs"]), mean_pm(s["barrier"], s["barrier_se"]), seconds(s["seconds"])]
            )
            csv_rows.append([method, wide["width"], w, s["pairs"], s["barrier"], s["barrier_se"], s["seconds"]])
    grid = next(iter(results["methods"].values()))["pairs"][0]["lambdas"]
    title = f"width {wide['width']} (seed {wide['seed']}) against narrower ViTs"
    figure = plot_band_grid([[Panel(title, "test loss (nats)", loss), Panel(title, ylabel, second)]], out / "fig3c.png")
    table = markdown(["method", "narrow width", "pairs", "barrier", "s / pair"], rows)
    csv = write_csv(
        out / "fig3c.csv",
        ["method", "wide_width", "narrow_width", "pairs", "barrier", "barrier_se", "seconds_per_pair"],
        csv_rows,
    )
    body = (
        "![Fig. 3c: width-heterogeneous interpolation paths](fig3c.png)\n\n"
        f"{table}\n\n"
        f"Test-loss barrier (nats) between the width-{wide['width']} ViT and each narrower one over {len(grid)} "
        "values of λ, mean ± s.e. where several pairs share a width. Files: [fig3c.csv](fig3c.csv)."
    )
    return [figure, csv, write_section(ARTEFACT, out, body)]


ARTEFACT = Artefact("fig3c", "Fig. 3c: aligning ViTs of different widths", (STEP,), make)
