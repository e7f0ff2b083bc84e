"""Paper 001 Fig. 9 (Appendix D): learned soft permutations (`learned_sinkhorn`). Per Sinkhorn temperature,
(a) how far the soft-aligned B drifts from B's function (`endpoint_deviation`), (b) the merged model's test
accuracy at lambda 0.5 for the soft path and its hard projection (`hard_projection`, exactly B's function)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from glmc.eval.bands import at_lambda, band, mean_spread, save
from glmc.report.artefact import Artefact, Step
from glmc.report.results import grid_results
from glmc.report.section import write_section
from glmc.report.tables import markdown, mean_pm, write_csv

METHOD = "learned_sinkhorn"
VARIANT = "hard_projection"
SWEPT = "sinkhorn_temperature"
# --tiny: two pairs of debug-sized models, two temperatures, five steps
STEP = Step(
    label="fig9_soft_permutations",
    overrides=("experiment=fig9_soft_permutations", "sweep=fig9"),
    multirun=True,
    tiny=("seeds=[0,1,2,3]", "matcher.learned.max_steps=5", "matcher.learned.sinkhorn_temperature=0.3,1"),
)


def collect(folder: Path) -> list[tuple[float, dict, dict[int, dict]]]:
    """Per job, ascending in the swept value: (value, the method's results, seed -> endpoint)."""
    out = []
    for results in grid_results(folder):
        if METHOD not in results["methods"]:
            continue
        value = float(results["config"]["matcher"][METHOD][SWEPT])
        if any(v == value for v, _, _ in out):
            raise ValueError(f"{folder}: two jobs ran {METHOD} with {SWEPT}={value}")
        out.append((value, results["methods"][METHOD], {e["seed"]: e for e in results["endpoints"]}))
    if not out:
        raise ValueError(f"no job in {folder} ran {METHOD}")
    return sorted(out, key=lambda job: job[0])


def make(root: Path, out: Path) -> list[Path]:
    out = Path(out)
    jobs = collect(Path(root) / STEP.label)
    values = [v for v, _, _ in jobs]
    # one row per seed pair, one column per swept value; pairs are matched by their seeds
    by_seeds = [{tuple(p["seeds"]): p for p in summary["pairs"]} for _, summary, _ in jobs]
    seeds = sorted({s for pairs in by_seeds for s in pairs})
    endpoints = {seed: e for _, _, ends in jobs for seed, e in ends.items()}

    def rows(get) -> list[list[float | None]]:
        return [[get(pairs[s], s) if s in pairs else None for pairs in by_seeds] for s in seeds]

    mid = lambda path: at_lambda(path["test_accuracy"], path["lambdas"], 0.5)
    drift = {
        "soft": rows(lambda p, s: p["endpoint_deviation"]),
        "hard": rows(lambda p, s: p[VARIANT]["endpoint_deviation"]),
    }
    accuracy = {"soft": rows(lambda p, s: mid(p)), "hard": rows(lambda p, s: mid(p[VARIANT]))}
    # the aligned B's test loss (lambda 0) above B's own: the drift in the task's terms
    loss_drift = rows(lambda p, s: at_lambda(p["test_loss"], p["lambdas"], 0.0) - endpoints[s[1]]["test_loss"])
    endpoint_accuracy = float(np.mean([e["test_accuracy"] for e in endpoints.values()]))

    fig, (ax_drift, ax_acc) = plt.subplots(1, 2, figsize=(10, 3.7))
    labels = {"soft": "soft (Sinkhorn)", "hard": "hard projection"}
    d = {kind: band(ax_drift, values, drift[kind], labels[kind]) for kind in labels}
    a = {kind: band(ax_acc, values, [[100 * x for x in r] for r in accuracy[kind]], labels[kind]) for kind in labels}
    ax_acc.axhline(100 * endpoint_accuracy, color="grey", linestyle=":", label="endpoints (mean)")
    ax_drift.set_ylabel("‖f(aligned B) − f(B)‖ / ‖f(B)‖")
    ax_drift.set_title("(a) endpoint drift: aligned B against B, test logits", fontsize=10)
    ax_acc.set_ylabel("test accuracy at λ = 0.5 (%)")
    ax_acc.set_title("(b) merged model", fontsize=10)
    for ax in (ax_drift, ax_acc):
        ax.set_xscale("log")
        ax.set_xticks(values, [f"{v:g}" for v in values])  # the swept values, not powers of ten
        ax.minorticks_off()
        ax.set_xlabel("Sinkhorn temperature")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Learned soft permutations, mean ± s.e. over {len(seeds)} seed pairs", fontsize=10)
    figure = save(fig, out / "fig9.png")

    loss_mean, loss_se = mean_spread(loss_drift, "se")
    table, csv_rows = [], []
    for i, value in enumerate(values):
        accuracies = [mean_pm(a[kind][0][i], a[kind][1][i], 1) for kind in ("soft", "hard")]
        drift = mean_pm(d["soft"][0][i], d["soft"][1][i], 4)
        table.append([f"{value:g}", drift, mean_pm(loss_mean[i], loss_se[i]), *accuracies])
        csv_rows.append(
            [value, len(seeds), d["soft"][0][i], d["soft"][1][i], d["hard"][0][i], loss_mean[i], loss_se[i]]
            + [a["soft"][0][i], a["soft"][1][i], a["hard"][0][i], a["hard"][1][i]]
        )
    csv = write_csv(
        out / "fig9.csv",
        [SWEPT, "pairs", "drift_soft", "drift_soft_se", "drift_hard", "endpoint_loss_gap", "endpoint_loss_gap_se"]
        + ["midpoint_acc_soft", "midpoint_acc_soft_se", "midpoint_acc_hard", "midpoint_acc_hard_se"],
        csv_rows,
    )
    header = ["temperature", "endpoint drift (soft)", "endpoint loss − B's", "λ = 0.5 acc. soft (%)"]
    body = (
        "![Fig. 9: soft permutations, endpoint drift and merged accuracy](fig9.png)\n\n"
        f"{markdown([*header, 'λ = 0.5 acc. hard (%)'], table)}\n\n"
        f"Mean ± s.e. over the disjoint seed pairs; the endpoints' mean test accuracy is "
        f"{100 * endpoint_accuracy:.1f} %. Drift: relative deviation of the soft-aligned B's test logits from "
        "B's; the hard projection computes B's function (its drift is at rounding level). "
        "Files: [fig9.csv](fig9.csv)."
    )
    return [figure, csv, write_section(ARTEFACT, out, body)]


ARTEFACT = Artefact("fig9", "Fig. 9: learned soft permutations, endpoint drift and merged accuracy", (STEP,), make)
