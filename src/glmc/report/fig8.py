"""Paper 001 Fig. 8 (Appendix C.1), ablations of learned matching, one grid job per (scheme, init):
(a) lambda sampling schemes: the test loss along the path, mean ± s.d. over the seed pairs;
(b) init from weight matching against the identity: per epoch, the training loss and the midpoint's test
    loss, read from each job's logs/learned_<a>-<b>/metrics.csv."""

from __future__ import annotations

import csv
from pathlib import Path

import matplotlib.pyplot as plt

from glmc.choices import LambdaScheme
from glmc.eval.bands import at_lambda, band, mean_spread, save
from glmc.report.artefact import Artefact, Step
from glmc.report.results import grid_jobs, run_results
from glmc.report.section import write_section
from glmc.report.tables import markdown, mean_pm, write_csv

METHOD = "learned"
# --tiny: two pairs of debug-sized models, two schemes x both inits, two epochs of four steps
STEP = Step(
    label="fig8_learned_ablation",
    overrides=("experiment=fig8_learned_ablation", "sweep=learned_ablation"),
    multirun=True,
    tiny=("seeds=[0,1,2,3]", "matcher.learned.max_steps=8", "matcher.learned.lambda_scheme=fixed,uniform_mid"),
)
INIT_SCHEME = "uniform_mid"  # (b) compares the inits under the scheme paper 001 adopts, where it ran
LAMBDA_SCHEMES = tuple(s.value for s in LambdaScheme)  # plot order: fixed, uniform_mid, uniform, gaussian
EPOCH_KEYS = {"train": "match_loss_epoch", "test": "match_test_loss"}


def _log_version(folder: Path) -> int:
    """A stage's CSV log folders: <name>, then <name>.2, <name>.3 ... for reruns in the same run folder."""
    _, _, suffix = folder.name.rpartition(".")
    return int(suffix) if "." in folder.name and suffix.isdigit() else 1


def epoch_metrics(run: Path, stage: str) -> dict[str, dict[int, float]]:
    """metric -> epoch -> value of a stage's (e.g. `learned_0-1`) metrics over its log folders in order."""
    out: dict[str, dict[int, float]] = {key: {} for key in EPOCH_KEYS.values()}
    logs = Path(run) / "logs"
    folders = [p for p in logs.glob(f"{stage}*") if p.name == stage or p.name.startswith(stage + ".")]
    for folder in sorted(folders, key=_log_version):
        path = folder / "metrics.csv"
        if not path.is_file():
            continue
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                for key in out:
                    if row.get(key):
                        out[key][int(row["epoch"])] = float(row[key])
    return out


def collect(folder: Path) -> dict[tuple[str, str], tuple[Path, dict]]:
    """(lambda scheme, init) -> (job folder, the method's results)."""
    out = {}
    for job in grid_jobs(folder):
        results = run_results(job)
        if METHOD not in results["methods"]:
            continue
        node = results["config"]["matcher"][METHOD]
        key = (str(node["lambda_scheme"]), str(node["init"]))
        if key in out:
            raise ValueError(f"{folder}: two jobs ran lambda_scheme={key[0]}, init={key[1]}")
        out[key] = (job, results["methods"][METHOD])
    if not out:
        raise ValueError(f"no job in {folder} ran {METHOD}")
    return out


def epoch_rows(job: Path, pairs: list[dict], key: str) -> tuple[list[int], list[list[float | None]]]:
    """The epochs logged and one row of `key` per seed pair over them."""
    per_pair = [epoch_metrics(job, f"{METHOD}_{p['seeds'][0]}-{p['seeds'][1]}")[key] for p in pairs]
    epochs = sorted(set().union(*per_pair))
    return epochs, [[values.get(e) for e in epochs] for values in per_pair]


def make(root: Path, out: Path) -> list[Path]:
    out = Path(out)
    jobs = collect(Path(root) / STEP.label)
    fig, (ax_path, ax_train, ax_test) = plt.subplots(1, 3, figsize=(14, 3.8))
    csv_rows = []

    # (a) schemes, each started from weight matching (from the identity where only that ran)
    rows_a = []
    for scheme in LAMBDA_SCHEMES:
        init = "weight" if (scheme, "weight") in jobs else "identity"
        if (scheme, init) not in jobs:
            continue
        pairs = jobs[(scheme, init)][1]["pairs"]
        lambdas = pairs[0]["lambdas"]
        mean, sd = band(ax_path, lambdas, [p["test_loss"] for p in pairs], scheme, spread="sd")
        barrier, barrier_sd = mean_spread([[p["barrier"]] for p in pairs], "sd")
        mid, mid_sd = at_lambda(mean, lambdas, 0.5), at_lambda(sd, lambdas, 0.5)
        rows_a.append([scheme, init, str(len(pairs)), mean_pm(barrier[0], barrier_sd[0]), mean_pm(mid, mid_sd)])
        csv_rows += [["a", scheme, init, "lambda", lam, m, s] for lam, m, s in zip(lambdas, mean, sd)]
    ax_path.set_xlabel("λ (θ = λ·θ_A + (1−λ)·θ_B)")
    ax_path.set_ylabel("test loss (nats)")
    ax_path.set_title("(a) λ sampling: loss along the path", fontsize=10)

    # (b) the inits under one scheme: per-epoch training loss and midpoint test loss
    scheme = next(s for s in (INIT_SCHEME, *LAMBDA_SCHEMES) if (s, "weight") in jobs or (s, "identity") in jobs)
    rows_b = []
    for init, style in (("weight", "-"), ("identity", "--")):
        if (scheme, init) not in jobs:
            continue
        job, summary = jobs[(scheme, init)]
        curves = {}
        for kind, ax in (("train", ax_train), ("test", ax_test)):
            epochs, values = epoch_rows(job, summary["pairs"], EPOCH_KEYS[kind])
            if not epochs:
                raise ValueError(f"{job}/logs holds no {EPOCH_KEYS[kind]} of {METHOD} (it needs logger=csv)")
            numbers = [e + 1 for e in epochs]
            curves[kind] = band(ax, numbers, values, f"init={init}", spread="sd", linestyle=style)
            csv_rows += [["b", scheme, init, f"epoch_{kind}", n, m, s] for n, m, s in zip(numbers, *curves[kind])]
        (train, train_sd), (test, test_sd) = curves["train"], curves["test"]
        for i in sorted({0, len(train) - 1}):
            rows_b.append([init, str(i + 1), mean_pm(train[i], train_sd[i]), mean_pm(test[i], test_sd[i])])
    for ax, what in ((ax_train, "training loss (sampled λ)"), (ax_test, "test loss at λ = 0.5")):
        ax.set_xlabel("epoch of learned matching")
        ax.set_ylabel(what)
        ax.set_title(f"(b) initialisation, λ {scheme}: {what}", fontsize=10)
    for ax in (ax_path, ax_train, ax_test):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    figure = save(fig, out / "fig8.png")
    csv_file = write_csv(out / "fig8.csv", ["panel", "scheme", "init", "x_kind", "x", "mean", "sd"], csv_rows)
    table_a = markdown(["λ scheme", "init", "pairs", "barrier", "test loss at λ = 0.5"], rows_a)
    table_b = markdown(["init", "epoch", "training loss", "test loss at λ = 0.5"], rows_b)
    body = (
        "![Fig. 8: learned matching, λ sampling schemes and initialisation](fig8.png)\n\n"
        f"(a) λ sampling schemes:\n\n{table_a}\n\n"
        f"(b) initialisation, λ scheme {scheme}, first and last epoch:\n\n{table_b}\n\n"
        "Mean ± s.d. over the disjoint seed pairs (nats). (b): per epoch, the mean training loss at the "
        "sampled λ and, after the epoch, the test loss of the path's midpoint; the last epoch may be partial "
        "(training stops at max_steps). Files: [fig8.csv](fig8.csv)."
    )
    return [figure, csv_file, write_section(ARTEFACT, out, body)]


ARTEFACT = Artefact("fig8", "Fig. 8: learned matching, λ sampling schemes and initialisation", (STEP,), make)
