"""Paper 001 Fig. 4: three digits ViTs on a shared universe: the loss over their simplex per method, the
Eq. 2 barrier and the pairwise Eq. 1 barriers (experiment=digits_universe)."""

from __future__ import annotations

from pathlib import Path

from glmc.eval.ternary import plot_simplex_heatmaps
from glmc.report.artefact import Artefact, Step
from glmc.report.results import run_results
from glmc.report.section import write_section
from glmc.report.tables import markdown, number, seconds, write_csv

# --tiny: a coarse grid (15 points) and a few refinement steps
STEP = Step(
    label="fig4_universe",
    overrides=("experiment=digits_universe",),
    tiny=("seeds=[0,1,2]", "multi.max_steps=5", "multi.step=0.25"),
)


def make(root: Path, out: Path) -> list[Path]:
    out = Path(out)
    folder = Path(root) / STEP.label
    results = run_results(folder)
    multi = results.get("multi")
    if not multi:
        raise ValueError(f"{folder}/results.json has no multi-model results: was it run with pairing=universe?")
    seeds = [e["seed"] for e in results["endpoints"]]
    if len(seeds) != 3:
        raise ValueError(f"{folder}: a ternary heatmap shows three models, the run has {len(seeds)} ({seeds})")
    figure = plot_simplex_heatmaps(
        multi,
        out / "fig4.png",
        title=f"{results['model']} on {results['dataset']}: test loss above the linear baseline",
        labels=[f"seed {s}" for s in seeds],
    )
    pair_keys = list(next(iter(multi.values()))["pairwise_barriers"])
    header = ["method", "Eq. 2 barrier", "at (a₀, a₁, a₂)", *(f"pair {k}" for k in pair_keys), "seconds"]
    rows, csv_rows = [], []
    for method, m in multi.items():
        at = "(" + ", ".join(f"{a:.2f}" for a in m["argmax"]) + ")"
        pairwise = [m["pairwise_barriers"][k] for k in pair_keys]
        rows.append([method, number(m["barrier"]), at, *(number(b) for b in pairwise), seconds(m["seconds"])])
        csv_rows.append([method, m["barrier"], *m["argmax"], *pairwise, m["seconds"]])
    csv = write_csv(
        out / "fig4.csv",
        ["method", "barrier", "argmax_0", "argmax_1", "argmax_2", *(f"pair_{k}" for k in pair_keys), "seconds"],
        csv_rows,
    )
    table = markdown(header, rows)
    body = (
        "![Fig. 4: loss over the simplex of three models per method](fig4.png)\n\n"
        f"{table}\n\n"
        "Eq. 2: the largest loss above the linear baseline over the simplex (at the barycentric point "
        "given); pair i-j: the Eq. 1 barrier between the aligned models of seeds i and j (nats). "
        "Files: [fig4.csv](fig4.csv)."
    )
    return [figure, csv, write_section(ARTEFACT, out, body)]


ARTEFACT = Artefact("fig4", "Fig. 4: three models on a shared universe", (STEP,), make)
