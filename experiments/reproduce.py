"""Regenerate tables and figures of paper 001, one command each.

    python experiments/reproduce.py table2 [fig3 ...] | all   [--tiny] [--rerun] [--jobs N] [--wandb]
    python experiments/reproduce.py --report                  # REPORT.md from every section.md

An artefact (`glmc.report.<name>.ARTEFACT`) lists the `run.py` invocations it needs (its steps) and
a `make` that turns their folders into files. Every step runs into `<root>/<step label>`, a folder
shared by all artefacts, so Table 2 and Fig. 3 read the same runs; a step whose folder already
holds finished results is skipped (`--rerun` runs it again). Then `make` writes the tables, figures
and section.md into `<out>/<name>/`, next to times.json (seconds per step).

--tiny adds `debug=fast` and each step's own shrinking overrides: every step takes seconds on a CPU
and the numbers mean nothing; it defaults to separate folders (outputs/reproduce-tiny) so debug runs
never mix with real ones.

--paper-size makes Table 2 from paper 001's own five columns at the paper's size
(`glmc.report.table2.PAPER_ARTEFACT`: experiment=cifar10_vit, cifar100_vit, tiny_imagenet_vit and
shakespeare_gpt2 with trainer=gpu, bookcorpus_gpt2 with trainer=ddp_gpu), into outputs/reproduce-paper and
report/paper_size; the data and the GPT-2 tokenizer come with --set (data.root=..., data.tokenizer_path=...).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from glmc.report.artefact import Artefact, Step
from glmc.report.registry import NAMES, load
from glmc.report.section import TIMES
from glmc.safe_files import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]
RECORD = "reproduce.json"  # in a step's folder once it finished: its overrides and how long it took
# The single run that trains a grid's endpoints first: cheap evaluation, whatever the grid evaluates.
ENDPOINT_RUN = (
    "matcher.methods=[canonical]",  # data-free, and unlike vanilla valid for endpoints of different widths
    "multi.methods=[vanilla]",
    "multi.step=0.5",
    "eval.num_lambdas=3",
    "merge=none",
    "hydra.mode=RUN",  # a sweep or experiment file may ask for MULTIRUN
)


@dataclass(frozen=True)
class Options:
    root: Path
    out: Path
    tiny: bool = False
    rerun: bool = False
    jobs: int = 2
    wandb: bool = False
    extra: tuple[str, ...] = ()  # --set: appended to every step (hardware, cache folder), not recorded
    paper_size: bool = False  # table2's paper-size columns instead of the embedded tasks


class StepFailed(RuntimeError):
    pass


def say(artefact: Artefact, message: str) -> None:
    print(f"[{artefact.name}] {message}", flush=True)


def load_artefacts(names: Sequence[str], paper_size: bool = False) -> list[Artefact]:
    """Only the modules asked for are imported: another artefact's missing module breaks nothing.
    `paper_size`: Table 2 at the paper's size, the only artefact that has that variant."""
    chosen = list(NAMES) if "all" in names else list(dict.fromkeys(names))
    if paper_size and chosen != ["table2"]:
        raise SystemExit(f"--paper-size makes Table 2 only: name table2 (not {', '.join(chosen)})")
    artefacts = []
    for name in chosen:
        try:
            artefacts.append(import_module("glmc.report.table2").PAPER_ARTEFACT if paper_size else load(name))
        except KeyError as err:
            raise SystemExit(err.args[0]) from err
        except ImportError as err:
            raise SystemExit(f"artefact {name}: glmc.report.{name} cannot be imported ({err})") from err
    check_labels(artefacts)
    return artefacts


def check_labels(artefacts: Sequence[Artefact]) -> None:
    """A step folder is shared by label, so one label must mean one set of runs everywhere."""
    seen: dict[str, tuple[str, Step]] = {}
    for artefact in artefacts:
        for step in artefact.steps:
            if step.label.endswith("_endpoints"):
                raise ValueError(f"{artefact.name}: step label {step.label!r} clashes with the endpoint runs' folders")
            owner, other = seen.setdefault(step.label, (artefact.name, step))
            assert other == step, (
                f"step label {step.label!r} means different runs in {owner} ({other}) and {artefact.name} ({step}): "
                "share the Step object, or give one of them another label"
            )


def step_overrides(step: Step, tiny: bool) -> list[str]:
    """What defines a step's results: its overrides, plus debug=fast and its tiny ones under --tiny."""
    return [*step.overrides, *(("debug=fast", *step.tiny) if tiny else ())]


def expected_jobs(folder: Path) -> int | None:
    """How many jobs the grid in `folder` launches, from the multirun.yaml Hydra wrote when it
    started (the sweep's own parameters, then the command line's, as the basic sweeper combines them)."""
    path = folder / "multirun.yaml"
    if not path.is_file():
        return None
    cfg = OmegaConf.load(path)
    params = cfg.hydra.sweeper.get("params")
    params = OmegaConf.to_container(params) if params else {}
    lines = [f"{k}={v}" for k, v in params.items()] + list(cfg.hydra.overrides.task)
    (jobs,) = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(lines), max_batch_size=None)
    return len(jobs)


def finished(step: Step, folder: Path) -> bool:
    if not step.multirun:
        return (folder / "results.json").is_file()
    n = expected_jobs(folder)
    return n is not None and all((folder / str(i) / "results.json").is_file() for i in range(n))


def read_record(folder: Path) -> dict:
    path = folder / RECORD
    return json.loads(path.read_text()) if path.is_file() else {}


def run_command(args: list[str], what: str, folder: Path, env: dict[str, str] | None = None) -> float:
    """One `run.py` process from the repository root; seconds it took. Its output goes straight to
    ours (progress bars, tables); a failure names the artefact, the step and the folder."""
    print("  $ python run.py " + " ".join(args), flush=True)  # the same call by hand, e.g. to debug a step
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "run.py", *args], cwd=ROOT, env=env)
    if proc.returncode != 0:
        raise StepFailed(
            f"{what} failed (exit code {proc.returncode}); its log is in {folder} (run.log, per job for a grid). "
            f"Command: {sys.executable} run.py {' '.join(args)}"
        )
    return time.perf_counter() - start


def endpoint_overrides(overrides: list[str]) -> list[str]:
    """The grid's overrides without its swept values (and without the settings ENDPOINT_RUN
    replaces). Swept keys that change the endpoints (e.g. seeds) train their other endpoints in the
    jobs, each in its own job, so nothing is trained twice."""
    replaced = {line.split("=", 1)[0] for line in ENDPOINT_RUN} | {"sweep"}
    kept = [
        o.input_line
        for o in OverridesParser.create().parse_overrides(overrides)
        if not o.is_sweep_override() and o.key_or_group not in replaced
    ]
    return [*kept, *ENDPOINT_RUN]


def run_step(artefact: Artefact, step: Step, opts: Options) -> dict:
    """Run one step unless its folder holds finished results; returns its times.json entry."""
    folder = opts.root / step.label
    defining = step_overrides(step, opts.tiny)
    record = read_record(folder)
    if finished(step, folder) and not opts.rerun:
        if record.get("overrides", defining) != defining:
            raise StepFailed(
                f"{artefact.name}: step {step.label}: {folder} holds runs of other overrides "
                f"({record['overrides']}, now {defining}); pass --rerun or choose another --root"
            )
        say(artefact, f"{step.label}: finished results in {folder}, skipped")
        return {"seconds": record.get("seconds"), "ran": False, "jobs": record.get("jobs")}

    overrides = [*defining, *opts.extra]
    if opts.wandb:
        overrides += ["logger=wandb", f"logger.group={artefact.name}"]
    if opts.rerun:
        overrides.append("overwrite=true")  # the run folder's guard refuses changed settings otherwise
    what = f"{artefact.name}: step {step.label}"
    seconds, jobs = 0.0, None
    if step.multirun:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # one core per job, BLAS too
        warm = opts.root / f"{step.label}_endpoints"
        if not (warm / "results.json").is_file() or opts.rerun:
            say(artefact, f"{step.label}: training the grid's endpoints once in {warm}")
            seconds += run_command(
                [*endpoint_overrides(overrides), f"hydra.run.dir={warm}"], f"{what} (endpoints)", warm
            )
        say(artefact, f"{step.label}: grid with {opts.jobs} parallel jobs into {folder}")
        seconds += run_command(
            [
                "-m",
                *overrides,
                f"hydra.sweep.dir={folder}",
                "hydra.sweep.subdir=${hydra.job.num}",  # job folders 0/, 1/, ...: easy to check and read
                "hydra/launcher=local_grid",
                f"hydra.launcher.n_jobs={opts.jobs}",
                "threads=1",
            ],
            what,
            folder,
            env,
        )
        jobs = expected_jobs(folder)
    else:
        say(artefact, f"{step.label}: running into {folder}")
        seconds += run_command([*overrides, f"hydra.run.dir={folder}"], what, folder)
    if not finished(step, folder):
        raise StepFailed(f"{what} exited without leaving finished results in {folder}")
    entry = {"seconds": seconds, "ran": True, "jobs": jobs}
    atomic_write_text(folder / RECORD, json.dumps({"overrides": defining, **entry}, indent=2) + "\n")
    say(artefact, f"{step.label}: done in {seconds:.1f} s")
    return entry


def reproduce(artefact: Artefact, opts: Options) -> list[Path]:
    out = opts.out / artefact.name
    out.mkdir(parents=True, exist_ok=True)
    steps = {step.label: run_step(artefact, step, opts) for step in artefact.steps}
    times = {"artefact": artefact.name, "cores": os.cpu_count(), "tiny": opts.tiny, "steps": steps}
    atomic_write_text(out / TIMES, json.dumps(times, indent=2) + "\n")
    say(artefact, f"writing {out}")
    try:
        files = artefact.make(opts.root, out)
    except Exception as err:
        raise StepFailed(f"{artefact.name}: make({opts.root}, {out}) failed: {err}") from err
    for path in files:
        say(artefact, f"wrote {path}")
    return files


REPORT_INTRO = """# Paper 001, reproduced

Each section below is one table or figure of paper 001, regenerated from scratch by the command it
names (all of them: `make reproduce`). The runs live in `outputs/reproduce/<step>/`, shared between
artefacts, and are reused when a command runs again; `--rerun` runs them anew. Every section says
how long its runs took and on how many cores."""

DEVICE_CHECK = "device_check.md"  # written by benchmarks/device_check.py --write-report
BEYOND_PAPERS = "beyond_papers.md"  # methods of our own against the papers' (written by hand from its runs)
LINK = re.compile(r"\]\((?!https?://|/|#)([^)]+)\)")


def write_report(out: Path) -> Path:
    """REPORT.md beside the output folder (the repository root for the default `report/`): the
    sections in NAMES order, their relative links rewritten to point into `<out>/<name>/`, after
    `<out>/conditions.md` where it exists (what else shared the machine while the times were taken:
    a fact no run records), `<out>/beyond_papers.md` where it exists (our methods beside the papers'),
    and `<out>/device_check.md` last where it exists (what benchmarks/device_check.py measured on a
    GPU, or that it is pending)."""
    target = out.parent / "REPORT.md"
    parts, missing = [REPORT_INTRO], []
    conditions = out / "conditions.md"
    if conditions.is_file():
        parts.append(conditions.read_text().strip())
    head = len(parts)
    for name in NAMES:
        section = out / name / "section.md"
        if not section.is_file():
            missing.append(name)
            continue
        prefix = os.path.relpath(section.parent, target.parent).replace(os.sep, "/")
        parts.append(LINK.sub(lambda m, p=prefix: f"]({p}/{m.group(1)})", section.read_text().strip()))
    if missing:
        parts.insert(head, "Not generated yet: " + ", ".join(f"`{n}`" for n in missing) + ".")
    for extra in (BEYOND_PAPERS, DEVICE_CHECK):
        if (out / extra).is_file():
            parts.append((out / extra).read_text().strip())
    return atomic_write_text(target, "\n\n".join(parts) + "\n")


def parse(argv: Sequence[str] | None) -> tuple[argparse.Namespace, Options]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"artefacts ({', '.join(NAMES)}) or all")
    parser.add_argument("--tiny", action="store_true", help="debug-sized runs of seconds each (tests)")
    parser.add_argument(
        "--paper-size",
        action="store_true",
        help="table2 from paper 001's five columns at the paper's size, on GPUs (outputs/reproduce-paper)",
    )
    parser.add_argument("--root", type=Path, help="step folders (outputs/reproduce, --tiny: outputs/reproduce-tiny)")
    parser.add_argument("--out", type=Path, help="artefact folders <out>/<name> (report, --tiny: <root>/report)")
    parser.add_argument("--rerun", action="store_true", help="run steps even when their folder holds results")
    parser.add_argument("--jobs", type=int, default=2, help="parallel jobs of a local grid (one thread each)")
    parser.add_argument("--wandb", action="store_true", help="log every run to W&B, grouped by artefact")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra run.py override for hardware or paths (trainer=gpu, cache_dir=...); finished steps are not rerun",
    )
    parser.add_argument("--report", action="store_true", help="rebuild REPORT.md from every section.md")
    args = parser.parse_args(argv)
    if not args.names and not args.report:
        parser.error("name an artefact (or all), or pass --report")
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: use at least 1")
    if args.paper_size and args.tiny:
        parser.error("--paper-size runs the paper's models and data on GPUs; --tiny checks the machinery on the CPU")
    if args.paper_size and args.report:
        parser.error("--report rebuilds REPORT.md from report/: run it without --paper-size")
    default_root = "outputs/reproduce-paper" if args.paper_size else "outputs/reproduce"
    root = args.root or ROOT / ("outputs/reproduce-tiny" if args.tiny else default_root)
    out = args.out or (root / "report" if args.tiny else ROOT / ("report/paper_size" if args.paper_size else "report"))
    # absolute: the runs start from the repository root, wherever this command was started
    opts = Options(
        root.resolve(), out.resolve(), args.tiny, args.rerun, args.jobs, args.wandb, tuple(args.set), args.paper_size
    )
    return args, opts


def main(argv: Sequence[str] | None = None) -> None:
    args, opts = parse(argv)
    artefacts = load_artefacts(args.names, opts.paper_size) if args.names else []
    for artefact in artefacts:
        start = time.perf_counter()
        try:
            reproduce(artefact, opts)
        except StepFailed as err:
            raise SystemExit(f"reproduce: {err}") from err
        say(artefact, f"done in {time.perf_counter() - start:.1f} s")
    if args.report:
        print(f"wrote {write_report(opts.out)}")


if __name__ == "__main__":
    main()
