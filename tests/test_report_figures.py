"""Figures 5, 7, 8 and 9 of paper 001: each make() reads run folders laid out as run.py and
experiments/reproduce.py write them (results.json per run or per grid job 0/, 1/, ..., Lightning CSV
logs under logs/<stage>/metrics.csv) and writes its PNG and a section.md with the plotted numbers;
the diagnostics and per-epoch metrics the figures read come from the matchers themselves."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from glmc.data.module import DataModule
from glmc.eval.evaluator import path_losses
from glmc.matching.base import MatchContext
from glmc.matching.engine.residual_map import eigen_angles
from glmc.matching.registry import build_matcher, method_config
from glmc.matching.weight import weight_matching
from glmc.models import to_canonical
from glmc.pipeline.run import run_pipeline, summarise
from glmc.report import fig5, fig7, fig8, fig9
from glmc.report.table2 import DIGITS_STEP
from glmc.report.tables import mean_pm, number
from glmc.symmetry import Orthogonal, Transform, apply
from glmc.train.latent_fit import fit_latents
from glmc.train.trainer import trainer_factory

from conftest import compose_config
from tiny_hf import tiny_vit

LAMBDAS = [0.0, 0.5, 1.0]
SEEDS = [0, 1, 2, 3, 4, 5]
PAIRS = [(0, 1), (2, 3), (4, 5)]


# -- run folders as run.py writes them ---------------------------------------------------------------


def pair_result(seeds, barrier=0.1, loss=(0.2, 0.5, 0.2), accuracy=(0.9, 0.6, 0.9), diagnostics=None, **more):
    """One entry of results.json's methods[name]["pairs"] (glmc.pipeline.run.evaluate_alignment + _run)."""
    return {
        "seeds": list(seeds),
        "barrier": barrier,
        "barrier_vs_mean": barrier,
        "lambdas": LAMBDAS,
        "test_loss": list(loss),
        "test_accuracy": list(accuracy),
        "endpoint_deviation": 1e-7,
        "function_preserving": True,
        "seconds": 0.5,
        "diagnostics": diagnostics or {},
        **more,
    }


def write_run(folder: Path, overrides: list[str], methods: dict[str, list[dict]], losses=None) -> Path:
    """results.json with the composed config of `overrides` (as run.py resolves it) and the method
    summaries run.py computes from the pairs."""
    cfg = compose_config(*overrides)
    losses = losses or {s: 0.2 for s in cfg.seeds}
    results = {
        "experiment": cfg.experiment,
        "model": cfg.model.name,
        "dataset": cfg.data.name,
        "task": "classification",
        "split": "test",
        "device": "cpu",
        "endpoints": [
            {"seed": s, "width": 64, "test_loss": losses[s], "test_accuracy": 0.9, "cached": True} for s in cfg.seeds
        ],
        "methods": {name: summarise(pairs) for name, pairs in methods.items()},
        "config": OmegaConf.to_container(cfg, resolve=True),
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(results, indent=2))
    return folder


def write_metrics(path: Path, epochs: dict[int, tuple[float, float]], steps_per_epoch: int = 2) -> None:
    """A learned-matching stage's CSVLogger file: per-step rows, then each epoch's row with the
    epoch-level metrics (match_loss_epoch, match_test_loss)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["epoch", "lambda", "match_loss", "match_loss_epoch", "match_test_loss", "step"])
        for epoch, (train, test) in sorted(epochs.items()):
            for i in range(steps_per_epoch):
                step = epoch * steps_per_epoch + i
                writer.writerow([epoch, 0.5, train + 0.01 * i, "", "", step])
            writer.writerow([epoch, "", "", train, test, step])


def section(out: Path) -> str:
    text = (out / "section.md").read_text()
    assert (out / "section.md").stat().st_size > 0 and "python experiments/reproduce.py" in text
    return text


def png(path: Path) -> bool:
    return path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- Fig. 5 ---------------------------------------------------------------------------------------


def test_fig5_histograms_and_table(tmp_path):
    g = np.random.default_rng(0)
    residual = {p: sorted(g.uniform(0, math.pi, 8).tolist()) for p in PAIRS}
    correction = {p: sorted(g.uniform(0, 0.3, 8).tolist()) for p in PAIRS}
    write_run(
        tmp_path / "root" / DIGITS_STEP.label,
        ["experiment=table2_digits", "matcher.methods=[weight,learned]"],
        {
            "weight": [pair_result(p, diagnostics={"residual_angles": residual[p]}) for p in PAIRS],
            "learned": [pair_result(p, diagnostics={"correction_angles": correction[p]}) for p in PAIRS],
        },
    )
    out = tmp_path / "out"
    files = fig5.make(tmp_path / "root", out)
    assert png(out / "fig5.png") and out / "section.md" in files
    text = section(out)
    assert "![" in text and "(fig5.png)" in text
    for method, key, angles in (("weight", "residual_angles", residual), ("learned", "correction_angles", correction)):
        pooled = np.concatenate([angles[p] for p in PAIRS])
        median, small = np.degrees(np.median(pooled)), 100 * np.mean(pooled < math.radians(10))
        assert f"| {method} | {key} | 3 | 24 | {number(median, 1)} | {number(small, 1)} |" in text
    # the correction's angles are all below 0.3 rad (17°); weight matching's spread over [0, pi]
    assert np.median(np.concatenate(list(correction.values()))) < np.median(np.concatenate(list(residual.values())))


def test_fig5_names_the_missing_diagnostics(tmp_path):
    write_run(
        tmp_path / DIGITS_STEP.label,
        ["experiment=table2_digits"],
        {"weight": [pair_result(p) for p in PAIRS], "learned": [pair_result(p) for p in PAIRS]},
    )
    with pytest.raises(KeyError, match="residual_angles"):
        fig5.make(tmp_path, tmp_path / "out")


# -- Fig. 7 ---------------------------------------------------------------------------------------


def test_fig7_barrier_per_iteration(tmp_path):
    grid = tmp_path / fig7.STEP.label
    barriers = {}
    job = 0
    for max_iter in (1, 2, 5):
        for method in ("weight", "weight_perm"):
            # orthogonal improves with iterations, permutation does not
            base = 1.0 / max_iter if method == "weight" else 0.8
            values = [base + 0.01 * k for k in range(len(PAIRS))]
            barriers[(method, max_iter)] = values
            pairs = [
                pair_result(p, barrier=b, diagnostics={"iterations": min(max_iter, 3)}) for p, b in zip(PAIRS, values)
            ]
            overrides = [
                "experiment=fig7_iterations",
                f"matcher.weight.max_iter={max_iter}",
                f"matcher.methods=[{method}]",
            ]
            write_run(grid / str(job), overrides, {method: pairs})
            job += 1
    out = tmp_path / "out"
    fig7.make(tmp_path, out)
    assert png(out / "fig7.png")
    text = section(out)
    for max_iter in (1, 2, 5):
        cells = []
        for method in ("weight", "weight_perm"):
            values = np.array(barriers[(method, max_iter)])
            cells += [mean_pm(values.mean(), values.std(ddof=1) / math.sqrt(len(values))), number(min(max_iter, 3), 1)]
        assert f"| {max_iter} | " + " | ".join(cells) + " |" in text
    rows = list(csv.DictReader(open(out / "fig7.csv")))
    assert len(rows) == 6 and {r["method"] for r in rows} == {"weight", "weight_perm"}


# -- Fig. 8 ---------------------------------------------------------------------------------------


def test_fig8_schemes_and_inits(tmp_path):
    grid = tmp_path / fig8.STEP.label
    jobs = [("fixed", "weight"), ("uniform_mid", "weight"), ("uniform_mid", "identity")]
    epochs = {}  # (init, pair) -> epoch -> (train, test)
    paths = {}
    for j, (scheme, init) in enumerate(jobs):
        offset = 0.0 if init == "weight" else 1.0
        pairs = []
        for k, p in enumerate(PAIRS):
            mid = 0.4 + 0.1 * k + (0.2 if scheme == "fixed" else 0.0)
            pairs.append(pair_result(p, barrier=mid - 0.2, loss=(0.2, mid, 0.2)))
            epochs[(init, p)] = {
                e: (offset + 1.0 / (e + 1) + 0.01 * k, offset + 1.2 / (e + 1) + 0.01 * k) for e in range(3)
            }
        overrides = [
            "experiment=fig8_learned_ablation",
            f"matcher.learned.lambda_scheme={scheme}",
            f"matcher.learned.init={init}",
        ]
        write_run(grid / str(j), overrides, {"learned": pairs})
        paths[(scheme, init)] = grid / str(j)
        if scheme != "uniform_mid":
            continue
        for p in PAIRS:
            stage = f"learned_{p[0]}-{p[1]}"
            if p == PAIRS[0]:  # an interrupted first run and its resumed continuation in <stage>.2
                first = {e: v for e, v in epochs[(init, p)].items() if e < 2}
                write_metrics(grid / str(j) / "logs" / stage / "metrics.csv", {**first, 2: (9.0, 9.0)})
                write_metrics(grid / str(j) / "logs" / f"{stage}.2" / "metrics.csv", {2: epochs[(init, p)][2]})
            else:
                write_metrics(grid / str(j) / "logs" / stage / "metrics.csv", epochs[(init, p)])
    assert fig8.epoch_metrics(paths[("uniform_mid", "weight")], "learned_0-1")["match_test_loss"] == {
        e: v[1] for e, v in epochs[("weight", (0, 1))].items()
    }  # the resumed run's epoch 2 replaces the interrupted one's
    out = tmp_path / "out"
    fig8.make(tmp_path, out)
    assert png(out / "fig8.png")
    text = section(out)
    for scheme in ("fixed", "uniform_mid"):
        mids = np.array([0.4 + 0.1 * k + (0.2 if scheme == "fixed" else 0.0) for k in range(3)])
        barrier = mean_pm((mids - 0.2).mean(), (mids - 0.2).std(ddof=1))
        assert f"| {scheme} | weight | 3 | {barrier} | {mean_pm(mids.mean(), mids.std(ddof=1))} |" in text
    assert "| gaussian |" not in text  # a scheme that did not run has no row
    assert "λ scheme uniform_mid" in text
    for init in ("weight", "identity"):
        for epoch in (0, 2):
            train = np.array([epochs[(init, p)][epoch][0] for p in PAIRS])
            test = np.array([epochs[(init, p)][epoch][1] for p in PAIRS])
            row = f"| {init} | {epoch + 1} | {mean_pm(train.mean(), train.std(ddof=1))} | "
            assert row + f"{mean_pm(test.mean(), test.std(ddof=1))} |" in text


def test_fig8_needs_the_epoch_logs(tmp_path):
    overrides = ["experiment=fig8_learned_ablation", "matcher.learned.lambda_scheme=uniform_mid"]
    write_run(tmp_path / fig8.STEP.label / "0", overrides, {"learned": [pair_result(p) for p in PAIRS]})
    with pytest.raises(ValueError, match="match_loss_epoch"):
        fig8.make(tmp_path, tmp_path / "out")


# -- Fig. 9 ---------------------------------------------------------------------------------------


def test_fig9_drift_and_midpoint_accuracy(tmp_path):
    grid = tmp_path / fig9.STEP.label
    temperatures = (0.3, 1.0)
    numbers = {}
    losses = {s: 0.2 + 0.01 * s for s in SEEDS}
    for j, t in enumerate(temperatures):
        pairs = []
        for k, p in enumerate(PAIRS):
            drift, soft, hard = 0.01 * t + 0.001 * k, 0.7 + 0.1 * t + 0.01 * k, 0.5 + 0.01 * k
            b_loss = losses[p[1]] + drift
            numbers[(t, p)] = (drift, soft, hard, b_loss - losses[p[1]])
            # a variant's entry is evaluate_alignment's dict alone: no seeds, seconds or diagnostics
            hard_path = pair_result(p, accuracy=(0.9, hard, 0.9))
            for key in ("seeds", "seconds", "diagnostics"):
                del hard_path[key]
            pairs.append(
                pair_result(
                    p,
                    loss=(b_loss, 0.4, 0.2),
                    accuracy=(0.9, soft, 0.9),
                    endpoint_deviation=drift,
                    hard_projection=hard_path,
                )
            )
        overrides = [
            "experiment=fig9_soft_permutations",
            f"matcher.learned.sinkhorn_temperature={t}",
            "seeds=[0,1,2,3,4,5]",
        ]
        write_run(grid / str(j), overrides, {"learned_sinkhorn": pairs}, losses)
    out = tmp_path / "out"
    fig9.make(tmp_path, out)
    assert png(out / "fig9.png")
    text = section(out)
    se = lambda v: np.std(v, ddof=1) / math.sqrt(len(v))
    for t in temperatures:
        drift, soft, hard, gap = (np.array([numbers[(t, p)][i] for p in PAIRS]) for i in range(4))
        cells = [
            f"{t:g}",
            mean_pm(drift.mean(), se(drift), 4),
            mean_pm(gap.mean(), se(gap)),
            mean_pm(100 * soft.mean(), 100 * se(soft), 1),
            mean_pm(100 * hard.mean(), 100 * se(hard), 1),
        ]
        assert "| " + " | ".join(cells) + " |" in text
    rows = list(csv.DictReader(open(out / "fig9.csv")))
    assert [float(r["sinkhorn_temperature"]) for r in rows] == list(temperatures)


# -- what the figures read, from the matchers --------------------------------------------------------


def planar_rotation(angles: list[float], width: int, seed: int = 0) -> torch.Tensor:
    """An orthogonal matrix with eigen-angles ±angles (one plane each), the rest fixed, in a random basis."""
    r = torch.eye(width, dtype=torch.float64)
    for i, t in enumerate(angles):
        c, s = math.cos(t), math.sin(t)
        r[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.tensor([[c, -s], [s, c]], dtype=torch.float64)
    basis = Orthogonal.sample(width, torch.Generator().manual_seed(seed), dtype=torch.float64).matrix
    return basis @ r @ basis.T


@pytest.mark.numeric
def test_eigen_angles_of_a_known_rotation():
    angles = [0.3, 1.2, 2.5]
    rotation = planar_rotation(angles, 8)
    expected = sorted([0.0, 0.0] + angles + angles)
    assert eigen_angles(rotation) == pytest.approx(expected, abs=1e-9)
    reflection = torch.diag(torch.tensor([-1.0, 1.0, 1.0], dtype=torch.float64))
    assert eigen_angles(reflection) == pytest.approx([0.0, 0.0, math.pi], abs=1e-12)


@pytest.mark.numeric
def test_weight_matching_reports_the_angles_of_a_hidden_rotation():
    a = to_canonical(tiny_vit(seed=0, hidden=16, heads=2, mlp=32))
    angles = [0.2, 0.6, 1.0, 1.4, 1.8, 2.2, 2.6, 3.0]  # eight planes fill width 16
    b = apply(Transform({"residual": Orthogonal(planar_rotation(angles, 16).float())}), a)
    _, diagnostics = weight_matching(a, b, "orthogonal")
    # T(B) = A needs the inverse rotation, whose angles are the same
    assert diagnostics["residual_angles"] == pytest.approx(sorted(angles + angles), abs=1e-3)
    _, permuted = weight_matching(a, b, "permutation")
    assert "residual_angles" not in permuted  # only an orthogonal residual map has them


def test_learned_correction_is_zero_when_learning_leaves_weight_matching(tmp_path):
    overrides = [
        "debug=fast",
        "logger=none",
        "matcher.learned.max_steps=1",
        "matcher.learned.lr=1e-12",  # one step that cannot move the latents
        "matcher.learned.init_noise=0",
        "matcher.learned.weight_decay=0",
    ]
    cfg = compose_config(*overrides)
    data = DataModule(cfg.data, seed=0)
    data.setup()
    pair = to_canonical(tiny_vit(0, hidden=16, heads=2, mlp=32)), to_canonical(tiny_vit(1, hidden=16, heads=2, mlp=32))
    make = trainer_factory(cfg.trainer)
    context = MatchContext(data=data, trainer=make, run_dir=tmp_path, fit=fit_latents, path_loss=path_losses)
    learned = build_matcher(method_config(cfg, "learned")).match(*pair, context)
    angles = learned.diagnostics["correction_angles"]
    assert len(angles) == 16 and max(angles) < 1e-4
    identity = build_matcher(method_config(compose_config(*overrides, "matcher.learned.init=identity"), "learned"))
    assert "correction_angles" not in identity.match(*pair, context).diagnostics  # no weight matching to correct


def test_learned_matching_logs_epoch_losses_without_changing_training(tmp_path):
    base = [
        "debug=fast",
        "logger=csv",
        f"cache_dir={tmp_path / 'endpoints'}",
        "matcher.methods=[learned]",
        "data.augment=true",  # random shifts from the global generator, which the test loader must not move
        "matcher.learned.max_steps=6",  # 256 training images in batches of 64: epochs of 4 steps, the last partial
    ]
    # endpoints cached first, and the same global random state before both runs: with augmentation,
    # matching draws from it, and a run that trains its endpoints leaves it elsewhere than one that loads them
    run_pipeline(compose_config(*base, "matcher.methods=[canonical]"), tmp_path / "endpoints_run")
    torch.manual_seed(0)
    logged = run_pipeline(compose_config(*base), tmp_path / "logged")
    torch.manual_seed(0)
    quiet = run_pipeline(compose_config(*base, "matcher.learned.epoch_test_batches=0"), tmp_path / "quiet")
    metrics = list(csv.DictReader(open(tmp_path / "logged" / "logs" / "learned_0-1" / "metrics.csv")))
    test_rows = [r for r in metrics if r["match_test_loss"]]
    train_rows = [r for r in metrics if r["match_loss_epoch"]]
    assert [int(r["epoch"]) for r in test_rows] == [0, 1] and [int(r["epoch"]) for r in train_rows] == [0, 1]
    assert all(0 < float(r["match_test_loss"]) < 10 for r in test_rows)
    assert sum(1 for r in metrics if r["match_loss"]) == 6  # the per-step key is unchanged
    per_epoch = fig8.epoch_metrics(tmp_path / "logged", "learned_0-1")
    assert sorted(per_epoch["match_test_loss"]) == [0, 1] and sorted(per_epoch["match_loss_epoch"]) == [0, 1]
    # switched off: no test evaluation, and the same training run (losses, latents, path)
    header = open(tmp_path / "quiet" / "logs" / "learned_0-1" / "metrics.csv").readline()
    assert "match_test_loss" not in header and "match_loss_epoch" in header
    on, off = (r["methods"]["learned"]["pairs"][0] for r in (logged, quiet))
    assert on["diagnostics"]["loss_history"] == off["diagnostics"]["loss_history"]
    assert on["diagnostics"]["correction_angles"] == off["diagnostics"]["correction_angles"]
    assert on["test_loss"] == off["test_loss"]
    # the setting only logs: both runs share a checkpoint key, so either resumes the other's checkpoint
    (pair_on,) = (p.name for p in (tmp_path / "logged" / "learned").glob("pair_*"))
    (pair_off,) = (p.name for p in (tmp_path / "quiet" / "learned").glob("pair_*"))
    assert pair_on == pair_off
