"""Paper 001 Table 2: each method's loss barrier on the digits ViT and the text GPT-2, its ratio to vanilla
and the seconds per pair (table2.md, .tex, .csv). `PAPER_ARTEFACT` (`--paper-size`) makes it from paper
001's own five columns at the paper's size."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from glmc.report.artefact import TINY_TEXT_MODEL, Artefact, Step
from glmc.report.results import barrier_stats, run_results
from glmc.report.section import write_table_section
from glmc.report.tables import latex, markdown, mean_pm, number, ratio, seconds

# --tiny: two pairs of debug-sized models and a short method list, learned matching for a few steps
DIGITS_STEP = Step(
    label="table2_digits",
    overrides=("experiment=table2_digits",),
    tiny=("seeds=[0,1,2,3]", "matcher.methods=[vanilla,weight,learned]", "matcher.learned.max_steps=5"),
)
TEXT_STEP = Step(
    label="table2_text",
    overrides=("experiment=table2_text",),
    tiny=(
        "model=gpt2_text",  # the experiment's own model, named for the reader (debug=fast keeps it)
        *TINY_TEXT_MODEL,
        "data.limit_train=96",
        "data.limit_test=24",
        "train.max_epochs=1",
        "seeds=[0,1,2,3]",
        "matcher.methods=[vanilla,weight,learned]",
        "matcher.learned.max_steps=5",
    ),
)
TASKS = (("digits ViT", DIGITS_STEP), ("text GPT-2", TEXT_STEP))
# the paper's size (App. B): data under data.root, the GPT-2 tokenizer from data.tokenizer_path (reproduce.py --set)
PAPER_TASKS = (
    ("ViT CIFAR-10", Step("table2_paper_cifar10", ("experiment=cifar10_vit", "trainer=gpu"))),
    ("ViT CIFAR-100", Step("table2_paper_cifar100", ("experiment=cifar100_vit", "trainer=gpu"))),
    ("ViT Tiny ImageNet", Step("table2_paper_tiny_imagenet", ("experiment=tiny_imagenet_vit", "trainer=gpu"))),
    ("GPT-2 Tiny Shakespeare", Step("table2_paper_shakespeare", ("experiment=shakespeare_gpt2", "trainer=gpu"))),
    ("GPT-2 BookCorpus", Step("table2_paper_bookcorpus", ("experiment=bookcorpus_gpt2", "trainer=ddp_gpu"))),
)


def task_runs(root: Path, tasks=TASKS) -> list[tuple[str, dict[str, Any]]]:
    """(task name, results.json) of every step, in column order; Fig. 3 reads the same runs."""
    return [(task, run_results(Path(root) / step.label)) for task, step in tasks]


def methods_in_order(runs: list[tuple[str, dict[str, Any]]]) -> list[str]:
    names: list[str] = []
    for _, results in runs:
        names += [m for m in results["methods"] if m not in names]
    return names


def make(root: Path, out: Path, tasks=TASKS, artefact: Artefact | None = None) -> list[Path]:
    runs = task_runs(root, tasks)
    stats = {
        (task, method): barrier_stats(m["pairs"]) for task, results in runs for method, m in results["methods"].items()
    }
    vanilla = {task: stats[(task, "vanilla")]["barrier"] if (task, "vanilla") in stats else None for task, _ in runs}
    header = ["method"]
    for task, _ in runs:
        header += [task, "× vanilla", "s / pair"]
    rows, csv_rows = [], []
    for method in methods_in_order(runs):
        row = [method]
        for task, _ in runs:
            s = stats.get((task, method))
            if s is None:  # a method run on one task only
                row += ["—"] * 3
                continue
            r = ratio(s["barrier"], vanilla[task])
            row += [mean_pm(s["barrier"], s["barrier_se"]), number(r, 2), seconds(s["seconds"])]
            csv_rows.append([method, task, s["pairs"], s["barrier"], s["barrier_se"], r, s["seconds"]])
        rows.append(row)
    pairs = sorted({s["pairs"] for s in stats.values()})
    caption = (
        f"Test-loss barrier (nats), mean ± s.e. over {'/'.join(map(str, pairs))} disjoint seed pairs; "
        "× vanilla: ratio of the mean barriers; s / pair: seconds to align one pair."
    )
    columns = ["method", "task", "pairs", "barrier", "barrier_se", "ratio_to_vanilla", "seconds_per_pair"]
    table, tex = markdown(header, rows), latex(header, rows, caption)
    return write_table_section(artefact or ARTEFACT, out, table, caption, columns, csv_rows, tex)


def make_paper_size(root: Path, out: Path) -> list[Path]:
    return make(root, out, PAPER_TASKS, PAPER_ARTEFACT)


ARTEFACT = Artefact(
    "table2", "Table 2: loss barrier per alignment method, digits ViT and text GPT-2", (DIGITS_STEP, TEXT_STEP), make
)
PAPER_ARTEFACT = Artefact(
    name="table2",
    title="Table 2 at the paper's size: loss barrier per alignment method, paper 001's five columns",
    steps=tuple(step for _, step in PAPER_TASKS),
    make=make_paper_size,
    flags="--paper-size",
)
