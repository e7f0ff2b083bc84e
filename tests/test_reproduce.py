"""experiments/reproduce.py: every artefact of ours from tiny runs (tables with finite numbers,
non-empty figures, section.md and times.json), skipping finished steps on a second call, a grid
step through the joblib launcher, and the launcher configs composing with their plugins."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from glmc.report.artefact import Artefact, Step

from conftest import CONF, ROOT, compose_config, run_script

sys.path.insert(0, str(ROOT / "experiments"))
import reproduce  # noqa: E402  (a script, importable once its folder is on the path)

OURS = ("table2", "fig3", "fig3c", "fig4")
FILES = {
    "table2": ("table2.md", "table2.tex", "table2.csv"),
    "fig3": ("fig3.png",),
    "fig3c": ("fig3c.png", "fig3c.csv"),
    "fig4": ("fig4.png", "fig4.csv"),
}


def reproduce_cli(*args: str, cwd=ROOT) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "experiments" / "reproduce.py"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def run_in_this_process(args: list[str], what: str, folder, env=None) -> float:
    """reproduce.run_command without a new interpreter: the same overrides through compose and
    run_pipeline (each run.py process spends seconds importing before it starts)."""
    from glmc.pipeline.run import run_pipeline

    assert not any(a.startswith("-m") for a in args), "a grid step needs the launcher: run it through run.py"
    start = time.perf_counter()
    run_pipeline(compose_config(*(a for a in args if not a.startswith("hydra."))), folder)
    return time.perf_counter() - start


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """All four artefacts once, from tiny runs, their run.py calls made in this process; the tests
    below read the same folders, and the second call goes through the command line."""
    base = tmp_path_factory.mktemp("reproduce")
    args = ["--tiny", "--root", str(base / "runs"), "--out", str(base / "report")]
    args += ["--set", f"cache_dir={base / 'endpoints'}", "--set", "logger=none"]
    printed, command = io.StringIO(), reproduce.run_command
    reproduce.run_command = run_in_this_process
    try:
        with contextlib.redirect_stdout(printed):
            reproduce.main([*OURS, *args])
    finally:
        reproduce.run_command = command
    return base, args, SimpleNamespace(stdout=printed.getvalue())


def finite(cell: str) -> bool:
    return cell != "" and math.isfinite(float(cell))


@pytest.mark.slow
def test_table2_has_every_method_and_task_with_finite_numbers(tiny):
    base, _, _ = tiny
    out = base / "report" / "table2"
    rows = list(csv.DictReader((out / "table2.csv").open()))
    methods = ["vanilla", "weight", "learned"]  # the tiny method list of both steps
    assert sorted((r["method"], r["task"]) for r in rows) == sorted(
        (m, t) for m in methods for t in ("digits ViT", "text GPT-2")
    )
    for row in rows:
        assert row["pairs"] == "2"
        assert all(finite(row[k]) for k in ("barrier", "barrier_se", "ratio_to_vanilla", "seconds_per_pair"))
    assert {float(r["ratio_to_vanilla"]) for r in rows if r["method"] == "vanilla"} == {1.0}
    tex = (out / "table2.tex").read_text()
    assert "\\begin{tabular}" in tex and "\\end{tabular}" in tex and "weight" in tex
    assert "| vanilla |" in (out / "table2.md").read_text()


@pytest.mark.slow
def test_every_artefact_writes_its_files_section_and_times(tiny):
    base, _, _ = tiny
    for name in OURS:
        out = base / "report" / name
        section = (out / "section.md").read_text()
        assert f"python experiments/reproduce.py {name}" in section
        for file in FILES[name]:
            assert (out / file).stat().st_size > 0, f"{name}: {file} is empty"
            link = f"]({file})"
            assert link in section, f"{name}: section.md does not link {file}"
        times = json.loads((out / "times.json").read_text())
        labels = [step.label for step in reproduce.load_artefacts([name])[0].steps]
        assert list(times["steps"]) == labels
        assert all(times["steps"][label]["seconds"] > 0 for label in labels)
        assert times["cores"] >= 1 and times["tiny"] is True
        assert "CPU cores" in section
    # fig3 reuses Table 2's runs instead of running them again
    assert "[fig3] table2_digits: finished results" in tiny[2].stdout
    for name, csv_name in (("fig3c", "fig3c.csv"), ("fig4", "fig4.csv")):
        rows = list(csv.DictReader((base / "report" / name / csv_name).open()))
        assert rows and all(finite(r["barrier"]) for r in rows)


@pytest.mark.slow
def test_second_call_skips_finished_steps_and_builds_the_report(tiny):
    base, args, _ = tiny
    before = {name: json.loads((base / "report" / name / "times.json").read_text()) for name in OURS}
    proc = reproduce_cli(*OURS, *args, "--report")
    assert "running into" not in proc.stdout
    for name in OURS:
        times = json.loads((base / "report" / name / "times.json").read_text())
        for label, entry in times["steps"].items():
            assert f"[{name}] {label}: finished results" in proc.stdout
            assert entry["ran"] is False
            assert entry["seconds"] == pytest.approx(before[name]["steps"][label]["seconds"])
    report = (base / "REPORT.md").read_text()
    assert report.index("Table 2") < report.index("Fig. 3:") < report.index("Fig. 3c") < report.index("Fig. 4")
    assert "](report/fig3/fig3.png)" in report and "](report/table2/table2.csv)" in report


@pytest.mark.slow
def test_grid_step_trains_endpoints_once_then_runs_every_job(tmp_path, monkeypatch, capsys):
    # the endpoint run through run_pipeline, the grid through run.py -m and its launcher, both in this
    # process (with one job the joblib launcher runs the jobs here too)
    def grid_in_this_process(args, what, folder, env=None):
        code, out, err = run_script(monkeypatch, capsys, *args)
        assert code == 0, out[-2000:] + err[-2000:]
        return 1.0

    either = lambda args, *rest: (grid_in_this_process if "-m" in args else run_in_this_process)(args, *rest)  # noqa: E731
    monkeypatch.setattr(reproduce, "run_command", either)
    step = Step("grid", ("matcher.methods=[vanilla],[canonical]",), multirun=True, tiny=("seeds=[0,1]",))
    artefact = Artefact("grid_test", "a grid", (step,), make=lambda root, out: [])
    extra = (f"cache_dir={tmp_path / 'endpoints'}", "logger=none")
    # one job at a time keeps the test short; the launcher path is the same for any n_jobs
    opts = reproduce.Options(tmp_path / "runs", tmp_path / "out", tiny=True, jobs=1, extra=extra)
    entry = reproduce.run_step(artefact, step, opts)
    assert entry["ran"] and entry["jobs"] == 2
    warm = json.loads((tmp_path / "runs" / "grid_endpoints" / "results.json").read_text())
    assert not any(e["cached"] for e in warm["endpoints"])  # trained here, before the grid
    for job, method in enumerate(("vanilla", "canonical")):
        results = json.loads((tmp_path / "runs" / "grid" / str(job) / "results.json").read_text())
        assert list(results["methods"]) == [method]
        assert results["config"]["threads"] == 1
        assert all(e["cached"] for e in results["endpoints"])  # the jobs only load them
    again = reproduce.run_step(artefact, step, opts)
    assert not again["ran"] and again["jobs"] == 2 and again["seconds"] == entry["seconds"]


def test_a_label_means_one_set_of_runs():
    make = lambda root, out: []
    a = Artefact("a", "A", (Step("shared", ("seeds=[0,1]",)),), make)
    b = Artefact("b", "B", (Step("shared", ("seeds=[2,3]",)),), make)
    reproduce.check_labels([a, a])
    with pytest.raises(AssertionError, match="shared"):
        reproduce.check_labels([a, b])
    reproduce.check_labels(reproduce.load_artefacts(list(OURS)))  # table2 and fig3 share their steps


def test_one_artefact_loads_without_the_others(monkeypatch):
    monkeypatch.setitem(sys.modules, "glmc.report.fig9", None)  # as if that module did not exist
    assert [a.name for a in reproduce.load_artefacts(["fig3"])] == ["fig3"]
    with pytest.raises(SystemExit, match="glmc.report.fig9"):
        reproduce.load_artefacts(["fig9"])
    with pytest.raises(SystemExit, match="unknown artefact"):
        reproduce.load_artefacts(["table9"])


def test_endpoint_run_drops_swept_values():
    overrides = ["sweep=seeds", "matcher.methods=[vanilla],[weight]", "debug=fast", "merge=all"]
    kept = reproduce.endpoint_overrides(overrides)
    assert "debug=fast" in kept and "hydra.mode=RUN" in kept
    assert not any(o.startswith(("sweep=", "merge=all")) or "[vanilla],[weight]" in o for o in kept)


@pytest.mark.parametrize(
    "launcher, target",
    [
        ("local_grid", "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"),
        ("slurm", "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"),
    ],
)
def test_launcher_configs_compose_with_their_plugins(launcher, target):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            config_name="config", overrides=["sweep=seeds", f"hydra/launcher={launcher}"], return_hydra_config=True
        )
    node = cfg.hydra.launcher
    assert node._target_ == target
    if launcher == "local_grid":
        assert node.n_jobs == 2 and node.prefer == "processes"
    else:
        settings = OmegaConf.to_container(node, resolve=False)
        for key in ("timeout_min", "cpus_per_task", "gpus_per_node", "mem_gb", "partition", "array_parallelism"):
            assert key in settings
        assert node.partition is None


def test_report_puts_the_conditions_note_after_the_intro_and_names_missing_sections(tmp_path):
    out = tmp_path / "report"
    (out / "fig7").mkdir(parents=True)
    (out / "fig7" / "section.md").write_text("## Fig. 7: iterations\n\n![curve](fig7.png)\n")
    (out / "conditions.md").write_text("Conditions of the times: alone on 2 cores.\n")
    report = reproduce.write_report(out).read_text()
    assert report.index("Conditions of the times") < report.index("Not generated yet") < report.index("## Fig. 7")
    assert "`table2`" in report and "`fig7`" not in report.split("## Fig. 7")[0]
    assert "](report/fig7/fig7.png)" in report


def test_report_ends_with_the_device_check_note(tmp_path):
    out = tmp_path / "report"
    (out / "fig7").mkdir(parents=True)
    (out / "fig7" / "section.md").write_text("## Fig. 7: iterations\n")
    report = reproduce.write_report(out).read_text()
    assert "Device check" not in report  # none written yet: nothing added
    (out / reproduce.DEVICE_CHECK).write_text("## Device check\n\nPending.\n")
    report = reproduce.write_report(out).read_text()
    assert report.rstrip().endswith("## Device check\n\nPending.")
    assert report.index("## Fig. 7") < report.index("## Device check")
