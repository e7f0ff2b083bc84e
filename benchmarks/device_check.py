"""What a GPU machine should confirm, in at most 10 minutes by this script's own clock, as one table.

    python benchmarks/device_check.py --tokenizer GPT2_FOLDER --shakespeare INPUT_TXT [--budget 560]
        [--out outputs/device_check] [--learned-steps 1000] [--write-report] [--dry-run]
    python benchmarks/device_check.py --only weight [--device cuda|cpu] [--layers N]

Parts, each in its own process with its own time limit (a part that runs out is stopped and reported as
such; the next part still runs):
  inputs       the tokenizer folder gives GPT-2's known ids ("Hello world" -> [15496, 995]); the corpus exists
  gpu tests    `pytest -m gpu`
  step cost    benchmarks/learned_step_cost.py --device cuda on the digits ViT (run.py's default) and on the
               paper-size GPT-2 shape (experiment=paper_gpt2_embedded, windows of 128), as docs/methods.md's tables
  weight       benchmarks/weight_floor.py --device cuda: weight matching on the card for GPT-2 124M (all 12
               layers) and the 1.1B Llama shape (cut to its first 4 of 22 layers, to fit the time), per
               iteration against the floor that script measures (products at the card's GEMM rate plus the
               assignments)
  shakespeare  paper 001's Tiny Shakespeare column at the paper's size (experiment=shakespeare_gpt2
               trainer=gpu) on two disjoint seed pairs, seeds 0-3, with the GPT-2 tokenizer of --tokenizer and
               the corpus of --shakespeare; it gets whatever time the other parts leave
Then one Markdown table of what was measured, headed by the card's name (torch.cuda.get_device_name), is
printed and written to <out>/device_check.md; --write-report also writes it to report/device_check.md,
which `experiments/reproduce.py --report` puts at the end of REPORT.md.

Learned matching runs --learned-steps steps per pair (default 1,000; the experiment's own 2,000 with
--learned-steps 2000) and learned_perm is left out (--methods), so that the column fits beside the other
parts; every other setting is the experiment's. A GPT-2 tokenizer folder comes from
benchmarks/gpt2_tokenizer_from_ranks.py; the corpus is the 1.1 MB char-rnn `input.txt` (a file, or a folder
holding input.txt or tiny_shakespeare/input.txt).

--only weight runs the weight parts alone (no tokenizer or corpus needed); with --device cpu they run on the
host, and --layers N cuts both shapes to N layers (`--only weight --device cpu --layers 1`: the same code path
in a few minutes on a workstation). Asked for CUDA without a visible CUDA device the script says so and exits
with status 2; --dry-run prints the commands it would run and exits 0 anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
METHODS = "vanilla,activation,weight_perm,weight,learned"  # Table 2's rows but learned_perm (time)
STEP_COST = {  # label -> learned_step_cost.py overrides
    "digits ViT": (),
    "paper-size GPT-2, windows of 128": ("experiment=paper_gpt2_embedded", "data.seq_len=128"),
}
WEIGHT_SHAPES = {  # label -> weight_floor.py's shape, its layers (None: all)
    "GPT-2 124M": ("gpt2-124m", None),
    "1.1B Llama shape": ("llama-1.1b", 4),
}
LIMITS = {"inputs": 60, "gpu tests": 75, "step cost": 70, "weight": 90}  # seconds per part (per run, per shape)


@dataclass
class Part:
    name: str
    command: list[str]
    limit: float  # seconds, at most what the budget leaves
    log: Path
    status: str = "not run"  # ok | failed (exit N) | ran out of time after N s | not run
    seconds: float = 0.0
    rows: list[tuple[str, str]] = field(default_factory=list)  # (what, measured) for the table


def corpus_file(path: Path) -> Path:
    for candidate in (path, path / "input.txt", path / "tiny_shakespeare" / "input.txt"):
        if candidate.is_file():
            return candidate
    raise SystemExit(f"--shakespeare {path}: no input.txt there (give the file or a folder holding it)")


def data_root(corpus: Path, out: Path) -> Path:
    """A data.root holding tiny_shakespeare/input.txt: the corpus's own folder where it is laid out so,
    else a folder under `out` with a copy."""
    if corpus.name == "input.txt" and corpus.parent.name == "tiny_shakespeare":
        return corpus.parent.parent
    target = out / "data" / "tiny_shakespeare" / "input.txt"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(corpus, target)
    return target.parent.parent


def shakespeare_command(args: argparse.Namespace, root: Path) -> list[str]:
    return [
        PY,
        "run.py",
        "experiment=shakespeare_gpt2",
        "trainer=gpu",
        "seeds=[0,1,2,3]",
        "pairing=disjoint",
        f"data.root={root}",
        f"data.tokenizer_path={args.tokenizer.resolve()}",
        f"matcher.methods=[{args.methods}]",
        f"matcher.learned.max_steps={args.learned_steps}",
        f"cache_dir={args.out / 'endpoints'}",
        "logger=none",
        f"hydra.run.dir={args.out / 'shakespeare'}",
    ]


def log_path(args: argparse.Namespace, name: str) -> Path:
    return args.out / f"{name.replace(' ', '_').replace(',', '')}.log"


def weight_parts(args: argparse.Namespace) -> list[Part]:
    """Weight matching against its floor, one part per shape, on --device (--layers: every shape cut so)."""
    parts = []
    for label, (shape, layers) in WEIGHT_SHAPES.items():
        layers = args.layers if args.layers is not None else layers
        command = [PY, "benchmarks/weight_floor.py", "--device", args.device, "--iterations", "2", "--shapes", shape]
        command += [] if layers is None else ["--layers", str(layers)]
        name = f"weight, {label}"
        # on the host (a smoke run of the same code path) only the budget bounds a part
        limit = LIMITS["weight"] if args.device == "cuda" else float("inf")
        parts.append(Part(name, command, limit, log_path(args, name)))
    return parts


def plan(args: argparse.Namespace, root: Path) -> list[Part]:
    if args.only == "weight":
        return weight_parts(args)
    log = lambda name: log_path(args, name)  # noqa: E731
    inputs = [
        PY,
        str(Path(__file__).resolve()),
        "--inputs-only",
        "--tokenizer",
        str(args.tokenizer),
        "--shakespeare",
        str(args.shakespeare),
    ]
    parts = [
        Part("inputs", inputs, LIMITS["inputs"], log("inputs")),
        Part(
            "gpu tests",
            [PY, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider"],
            LIMITS["gpu tests"],
            log("gpu_tests"),
        ),
    ]
    for label, overrides in STEP_COST.items():
        command = [PY, "benchmarks/learned_step_cost.py", "--device", "cuda", *overrides]
        parts.append(Part(f"step cost, {label}", command, LIMITS["step cost"], log(f"step_cost {label}")))
    parts += weight_parts(args)
    parts.append(Part("shakespeare", shakespeare_command(args, root), float("inf"), log("shakespeare")))
    return parts


def run_part(part: Part, deadline: float, floor: float = 5.0) -> None:
    """Run `part` in its own process group until it ends or its limit (or the budget's end) comes; not at all
    when less than `floor` seconds are left."""
    limit = max(0.0, min(part.limit, deadline - time.monotonic()))
    if limit < floor:
        part.status = "not run: the budget was spent"
        return
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
    }
    start = time.monotonic()
    with part.log.open("w") as log:
        proc = subprocess.Popen(
            part.command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            code = proc.wait(timeout=limit)
            part.status = "ok" if code == 0 else f"failed (exit {code})"
        except subprocess.TimeoutExpired:
            stop(proc)
            part.status = f"ran out of time after {limit:.0f} s"
    part.seconds = time.monotonic() - start


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the part's process group (the pipeline then says where its checkpoints are), then SIGKILL
    to whatever of the group is left after 15 s (data-loader workers too)."""
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:  # the whole group is gone
            break
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue


def pytest_rows(text: str) -> list[tuple[str, str]]:
    found = re.findall(r"=+ (.*?(?:passed|failed|skipped|error|deselected).*?) in [\d.]+s", text)
    return [("`pytest -m gpu`", found[-1] if found else "no summary line")]


def step_cost_rows(label: str, text: str) -> list[tuple[str, str]]:
    numbers = {
        key: re.search(pattern, text)
        for key, pattern in (
            ("plain", r"plain training step \(HF endpoint\)\s+([\d.]+) ms"),
            ("learned", r"learned matching step .*?\)\s+([\d.]+) ms"),
            ("projections", r"projections with the solver every step\s+([\d.]+) ms"),
            ("ratio", r"ratio learned / plain\s+([\d.]+)x"),
        )
    }
    if not all(numbers.values()):
        return [(f"learned step, {label}", "no timings in the output")]
    n = {k: m.group(1) for k, m in numbers.items()}
    return [
        (
            f"learned step, {label}",
            f"plain {n['plain']} ms, learned {n['learned']} ms ({n['ratio']}x), projections {n['projections']} ms",
        )
    ]


WEIGHT_FIGURES = {  # weight_floor.py's wording
    "cut": r"== \S+ -- CUT to (\d+ of \d+ layers)",
    "rate": r"float32 ([\d.]+) GFLOP/s",
    "row": r"^ +([\d.]+) +([\d.]+) +([\d.]+) +([\d.]+) +([\d.]+)x +(\d+)%",
    "decompositions": r"decompositions .*? ([\d.]+) s per iteration",
    "peak": r"peak memory above the two models: ([\d.]+ GiB)",
}


def weight_rows(label: str, text: str) -> list[tuple[str, str]]:
    """One shape's weight matching per iteration: seconds against the floor, the floor's parts, memory."""
    found = {key: re.search(pattern, text, re.MULTILINE) for key, pattern in WEIGHT_FIGURES.items()}
    what = f"weight matching, {label}" + (f" ({found['cut'].group(1)})" if found["cut"] else "")
    if not (found["row"] and found["rate"]):
        return [(what, "no table in the output")]
    seconds, products, assign, floor, ratio, share = found["row"].groups()
    extra = f"; decompositions {found['decompositions'].group(1)} s" if found["decompositions"] else ""
    extra += f"; {found['peak'].group(1)} above the two models" if found["peak"] else ""
    measured = (
        f"{seconds} s / iteration, {ratio}x its floor of {floor} s (products {products} s at "
        f"{found['rate'].group(1)} GFLOP/s float32, assignments {assign} s, {share} % of the total){extra}"
    )
    return [(what, measured)]


def shakespeare_rows(results: dict) -> list[tuple[str, str]]:
    """Endpoint losses (and the epoch each kept) and each method's barrier, mean ± s.e. and per pair."""
    ends = results["endpoints"]
    kept = [str(e.get("kept", {}).get("epoch", "?")) for e in ends]
    rows = [
        (
            f"endpoint test loss (seeds {', '.join(str(e['seed']) for e in ends)})",
            " / ".join(f"{e['test_loss']:.3f}" for e in ends) + f" (epochs kept: {', '.join(kept)})",
        )
    ]
    for method, m in results["methods"].items():
        pairs = ", ".join(f"({p['seeds'][0]}, {p['seeds'][1]}) {p['barrier']:.3f}" for p in m["pairs"])
        se = "" if m.get("barrier_se") is None else f" ± {m['barrier_se']:.3f}"
        rows.append((f"barrier, {method}", f"{m['barrier']:.3f}{se} nats; {pairs}; {m['seconds']:.0f} s / pair"))
    return rows


def collect(part: Part, args: argparse.Namespace) -> None:
    text = part.log.read_text(errors="replace") if part.log.is_file() else ""
    if part.name == "gpu tests":
        part.rows = pytest_rows(text)
    elif part.name.startswith("step cost, ") and part.status == "ok":
        part.rows = step_cost_rows(part.name.removeprefix("step cost, "), text)
    elif part.name.startswith("weight, ") and part.status == "ok":
        part.rows = weight_rows(part.name.removeprefix("weight, "), text)
    elif part.name == "shakespeare":
        results = args.out / "shakespeare" / "results.json"
        if results.is_file():
            part.rows = shakespeare_rows(json.loads(results.read_text()))
    elif part.name == "inputs" and part.status == "ok":
        part.rows = [("GPT-2 tokenizer and corpus", text.strip().splitlines()[-1] if text.strip() else "checked")]
    if part.status != "ok" and not part.rows:
        tail = " | ".join(text.strip().splitlines()[-2:])[-300:]
        part.rows = [("output's last lines", f"`{tail}`" if tail else "none")]


def table(parts: list[Part], card: str, args: argparse.Namespace, total: float) -> str:
    if args.only == "weight":
        options = f"--only weight --device {args.device}" + ("" if args.layers is None else f" --layers {args.layers}")
        head = f"Weight matching on {card} (`python benchmarks/device_check.py {options}`, {total:.0f} s in all):"
    else:
        head = (
            f"Device check on one {card} (`python benchmarks/device_check.py`, {total:.0f} s in all; Tiny "
            f"Shakespeare at paper size, learned matching {args.learned_steps} steps per pair, methods {args.methods}):"
        )
    lines = [
        head,
        "",
        "| part | status | seconds | measured | value |",
        "| --- | --- | --- | --- | --- |",
    ]
    for part in parts:
        for i, (what, value) in enumerate(part.rows or [("—", "—")]):
            head = (part.name, part.status, f"{part.seconds:.0f}") if i == 0 else ("", "", "")
            lines.append(f"| {' | '.join(head)} | {what} | {value} |")
    return "\n".join(lines)


def check_inputs(args: argparse.Namespace) -> int:
    """The --inputs-only part: GPT-2's known ids from the tokenizer folder, the corpus's size."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpt2_tokenizer_from_ranks import check_known_ids

    problems = check_known_ids(args.tokenizer)
    for problem in problems:
        print(f"tokenizer {args.tokenizer}: {problem}")
    corpus = corpus_file(args.shakespeare)
    print(f"GPT-2's known ids {'check out' if not problems else 'differ'}; corpus {corpus.stat().st_size:,} bytes")
    return 1 if problems else 0


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", type=Path, help="GPT-2 tokenizer folder (save_pretrained)")
    parser.add_argument("--shakespeare", type=Path, help="Tiny Shakespeare input.txt, or its folder")
    parser.add_argument("--budget", type=float, default=560.0, help="seconds for everything (default 560)")
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "device_check", help="logs, runs, table")
    parser.add_argument("--learned-steps", type=int, default=1000, help="learned-matching steps per pair")
    parser.add_argument("--methods", default=METHODS, help=f"Tiny Shakespeare methods (default {METHODS})")
    parser.add_argument("--write-report", action="store_true", help="also write report/device_check.md")
    parser.add_argument("--dry-run", action="store_true", help="print the commands and exit")
    parser.add_argument("--only", choices=("weight",), help="run only these parts (weight: weight matching)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="where the weight parts run")
    parser.add_argument("--layers", type=int, help="cut every weight-matching shape to this many layers")
    parser.add_argument("--inputs-only", action="store_true", help=argparse.SUPPRESS)  # the first part
    args = parser.parse_args(argv)
    if args.only is None and (args.tokenizer is None or args.shakespeare is None):
        parser.error("--tokenizer and --shakespeare are required unless --only weight")
    if args.only is None and args.device != "cuda":
        parser.error(f"--device {args.device} applies to the weight parts alone: add --only weight")
    if args.only is not None and args.write_report:
        parser.error("--write-report writes the whole check's table to report/device_check.md: leave out --only")
    args.out = args.out.resolve()
    return args


def main(argv: list[str] | None = None) -> int:
    start = time.monotonic()
    args = parse(argv)
    if args.inputs_only:
        return check_inputs(args)
    import torch

    if not args.dry_run and args.device == "cuda" and not torch.cuda.is_available():
        print(
            "device check: no CUDA device is visible here; run it on a GPU machine (--dry-run prints the commands; "
            "--only weight --device cpu runs the weight parts on the host)"
        )
        return 2
    if not args.dry_run:
        args.out.mkdir(parents=True, exist_ok=True)
    if args.dry_run or args.only is not None:
        root = args.out / "data"
    else:
        root = data_root(corpus_file(args.shakespeare), args.out)
    parts = plan(args, root)
    if args.dry_run:
        for part in parts:
            limit = "the rest of the budget" if part.limit == float("inf") else f"{part.limit:.0f} s"
            print(f"# {part.name} (at most {limit})\n{' '.join(part.command)}")
        return 0
    card = torch.cuda.get_device_name(0) if args.device == "cuda" else "the host"
    deadline = start + args.budget - 15  # the table and its files after the last part
    for part in parts:
        print(f"[device check] {part.name}: {' '.join(part.command[1:])}", flush=True)
        run_part(part, deadline)
        collect(part, args)
        print(f"[device check] {part.name}: {part.status} ({part.seconds:.0f} s)", flush=True)
    text = table(parts, card, args, time.monotonic() - start)
    print(text)
    (args.out / "device_check.md").write_text(text + "\n")
    if args.write_report:
        (ROOT / "report" / "device_check.md").write_text("## Device check\n\n" + text + "\n")
    return 0 if all(part.status == "ok" for part in parts) else 1


if __name__ == "__main__":
    sys.exit(main())
