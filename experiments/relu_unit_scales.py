"""The loss barrier of weight matching with and without ReLU units' positive scales (matcher.weight.unit_scales).

    .venv/bin/python experiments/relu_unit_scales.py [--out outputs/relu_scales] [--skip-runs] [overrides ...]

Trains (or reads from the endpoint cache) six character-level OPTs (model=opt_text at demo size: two layers,
ReLU MLP, demo_text's two epochs; seeds 0..5, disjoint pairs), then runs run.py twice on them: vanilla and
weight matching with the unit scales, and weight matching without them. Prints a markdown table per pair.
Extra arguments are passed to both runs as Hydra overrides.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASE = ["experiment=demo_text", "model=opt_text", "model.num_layers=2", "seeds=[0,1,2,3,4,5]"]
RUNS = {
    "with_scales": ["matcher.methods=[vanilla,weight]"],
    "without_scales": ["matcher.methods=[weight]", "matcher.weight.unit_scales=false"],
}


def barriers(folder: Path) -> dict[str, dict[tuple[int, ...], float]]:
    """Per method, per seed pair, the barrier (nats) in a run folder's results.json."""
    methods = json.loads((folder / "results.json").read_text())["methods"]
    return {m: {tuple(p["seeds"]): p["barrier"] for p in r["pairs"]} for m, r in methods.items()}


def table(with_scales: dict, without: dict) -> str:
    pairs = sorted(with_scales["vanilla"])
    cols = [with_scales["vanilla"], without["weight"], with_scales["weight"]]
    lines = [
        "| pair | vanilla | weight, no unit scales | weight, unit scales |",
        "|---|---|---|---|",
    ]
    for pair in pairs:
        lines.append(f"| {pair[0]}-{pair[1]} | " + " | ".join(f"{c[pair]:.4f}" for c in cols) + " |")
    means = [sum(c[p] for p in pairs) / len(pairs) for c in cols]
    lines.append("| mean | " + " | ".join(f"{m:.4f}" for m in means) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="outputs/relu_scales", help="the runs' parent folder")
    parser.add_argument("--skip-runs", action="store_true", help="only tabulate runs already in --out")
    args, overrides = parser.parse_known_args()
    out = Path(args.out)
    for name, own in RUNS.items():
        if not args.skip_runs:
            command = [sys.executable, "run.py", *BASE, *own, *overrides, f"hydra.run.dir={out / name}"]
            print(" ".join(command), flush=True)
            subprocess.run(command, cwd=ROOT, check=True)
    print(table(barriers(out / "with_scales"), barriers(out / "without_scales")))


if __name__ == "__main__":
    main()
