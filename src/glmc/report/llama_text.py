"""Character-level Llamas (RMSNorm, rotary, grouped-query attention, SwiGLU) on the embedded corpus, every
matcher of grouped rotary heads, and the targets: weight at most 0.35x vanilla, learned at most 0.05 nats."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from glmc.report.artefact import TINY_TEXT_MODEL, Artefact, Step
from glmc.report.results import barrier_stats, run_results
from glmc.report.section import write_table_section
from glmc.report.tables import markdown, mean_pm, number, ratio, seconds

TINY = (
    "model=llama_text",  # the experiment's own model, named for the reader (debug=fast keeps it)
    *TINY_TEXT_MODEL,
    "model.num_kv_heads=1",  # two query heads share one key/value head
    "data.limit_train=64",
    "data.limit_test=16",
    "train.max_epochs=1",
    "seeds=[0,1]",
    "matcher.learned.max_steps=3",
)
RUN = Step(label="llama_text", overrides=("experiment=llama_text",), tiny=TINY)
# the same endpoints with every head interpolated as factored weights (the in-head maps solved, not quotiented)
FACTORED = Step(
    label="llama_text_factored",
    overrides=("experiment=llama_text", "symmetry.qk=none", "symmetry.vo=none", "matcher.methods=[weight,learned]"),
    tiny=TINY,
)

METHODS = {
    "vanilla": "vanilla averaging",
    "weight_perm": "weight matching, permuted residual",
    "weight": "weight matching (orthogonal residual, groups, rotary maps)",
    "activation": "activation matching",
    "learned": "learned matching",
    "weight factored": "weight matching, heads factored",
    "learned factored": "learned matching, heads factored",
}
WEIGHT_TARGET, LEARNED_TARGET = 0.35, 0.05


def collect(root: Path) -> dict[str, Any]:
    results = run_results(Path(root) / RUN.label)
    methods = {m: results["methods"][m] for m in METHODS if m in results["methods"]}
    if (Path(root) / FACTORED.label).exists():
        factored = run_results(Path(root) / FACTORED.label)["methods"]
        methods.update({f"{m} factored": factored[m] for m in ("weight", "learned") if m in factored})
    return {
        "endpoints": [e["test_loss"] for e in results["endpoints"]],
        "stats": {m: barrier_stats(r["pairs"]) for m, r in methods.items()},
        "per_pair": {m: [p["barrier"] for p in r["pairs"]] for m, r in methods.items()},
    }


def verdict(stats: dict[str, Any], per_pair: dict[str, list[float]]) -> list[str]:
    """One line per target: met on the mean and on how many pairs."""
    lines = []
    if "vanilla" in per_pair and "weight" in per_pair:
        ratios = [w / v for w, v in zip(per_pair["weight"], per_pair["vanilla"])]
        mean = ratio(stats["weight"]["barrier"], stats["vanilla"]["barrier"])
        met = sum(r <= WEIGHT_TARGET for r in ratios)
        lines.append(
            f"weight / vanilla: {number(mean, 2)} on the mean (target ≤ {WEIGHT_TARGET}), "
            f"{', '.join(number(r, 2) for r in ratios)} per pair: met on {met} of {len(ratios)}"
        )
    if "learned" in per_pair:
        values = per_pair["learned"]
        met = sum(v <= LEARNED_TARGET for v in values)
        lines.append(
            f"learned: {number(stats['learned']['barrier'])} nats on the mean (target ≤ {LEARNED_TARGET}), "
            f"met on {met} of {len(values)} pairs"
        )
    return lines


def make(root: Path, out: Path) -> list[Path]:
    data = collect(root)
    stats, per_pair = data["stats"], data["per_pair"]
    base = stats.get("vanilla", {}).get("barrier")
    header = ["method", "barrier (nats)", "× vanilla", "per pair", "s / pair"]
    rows = [
        [
            METHODS[m],
            mean_pm(s["barrier"], s["barrier_se"]),
            number(ratio(s["barrier"], base), 2),
            ", ".join(number(v) for v in per_pair[m]),
            seconds(s["seconds"]),
        ]
        for m, s in stats.items()
    ]
    table = markdown(header, rows)
    losses = data["endpoints"]
    caption = (
        f"Test-loss barriers (nats per character), mean ± s.e. over {len(next(iter(per_pair.values())))} disjoint "
        f"pairs; endpoints at test loss {min(losses):.2f}–{max(losses):.2f}. Heads are interpolated as circuits: "
        "the models' rotary heads stacked, each block rotated as its own (glmc.interpolation); heads factored: the "
        "same endpoints with q, k, v, o averaged as tensors after the closed-form in-head maps."
    )
    columns = ["method", "pairs", "barrier", "barrier_se", "seconds", "per_pair"]
    csv_rows = [[m, s["pairs"], s["barrier"], s["barrier_se"], s["seconds"], per_pair[m]] for m, s in stats.items()]
    lines = "\n".join(f"- {line}" for line in verdict(stats, per_pair))
    return write_table_section(ARTEFACT, out, table, f"{caption}\n\n{lines}", columns, csv_rows)


ARTEFACT = Artefact(
    name="llama_text",
    title="Llama-style models: barriers on the embedded corpus (grouped-query attention, rotary, SwiGLU)",
    steps=(RUN, FACTORED),
    make=make,
)
