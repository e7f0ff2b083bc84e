"""Weight matching speed at paper size: median seconds over repeats at a fixed 15 iterations.

    .venv/bin/python benchmarks/matching_speed.py [--repeats 5] [--iterations 15] [--vocab-rows 30000]

Pairs: two CIFAR ViTs (6 layers, width 256, MLP 512, 8 heads, patch 4) and two BookCorpus GPT-2s
(6 layers, width 512, MLP 2048, 8 heads, vocabulary 50257), the latter with the embedding rows
restricted to the tokens a training split uses (as the pipeline does) and unrestricted. The models
are randomly initialised: the cost of an iteration does not depend on the weights, and the tolerance
is set so that every run does exactly the requested number of iterations. Prints the median and the breakdown by step,
and the ViT time as a ratio to the 1 s target; then each pair again by the earlier path, which
recomputes every product every iteration and solves the layers' assignment problems one after
another (`reuse=False, threads=1`: the same solutions), and the ratio of the two.

    git worktree add /tmp/before b862cd1
    .venv/bin/python benchmarks/matching_speed.py --against /tmp/before [--rounds 4] [--repeats 2]

--against times the same pairs in an earlier checkout of glmc beside this one: each round runs the
earlier tree's code and then this tree's in processes of their own (their sources first on the path),
`--repeats` runs of each pair each, at the fixed 15 iterations and at the default tolerance; prints
the medians over all rounds and their ratios. Alternating the two spreads a machine's slow spells over
both.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, ViTConfig, ViTForImageClassification

from glmc.matching.weight import weight_matching
from glmc.models import to_canonical


def cifar_vit(seed: int):
    torch.manual_seed(seed)
    return ViTForImageClassification(
        ViTConfig(
            image_size=32,
            patch_size=4,
            num_channels=3,
            hidden_size=256,
            num_hidden_layers=6,
            num_attention_heads=8,
            intermediate_size=512,
            num_labels=10,
        )
    )


def bookcorpus_gpt2(seed: int):
    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(n_embd=512, n_layer=6, n_head=8, n_inner=2048, vocab_size=50257, n_positions=512))


def measure(
    build,
    repeats: int,
    iterations: int,
    tokens: torch.Tensor | None = None,
    threads: int | None = None,
    reuse: bool = True,
) -> dict[str, float]:
    a, b = to_canonical(build(0)), to_canonical(build(1))
    totals, steps = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        _, diag = weight_matching(
            a, b, "orthogonal", max_iter=iterations, tol=-float("inf"), tokens=tokens, threads=threads, reuse=reuse
        )
        totals.append(time.perf_counter() - start)
        assert diag["iterations"] == iterations
        steps.append(diag["seconds_by_step"])
    out = {"median_s": statistics.median(totals)}
    for key in steps[0]:
        out[key] = statistics.median(s[key] for s in steps)
    return out


def paper_pairs(vocab_rows: int) -> tuple:
    """(name, builder, vocabulary rows or None) of the pairs timed."""
    # BookCorpus's training split uses a subset of GPT-2's 50,257 ids; weight matching keeps those
    # rows only (paper 001's public code). --vocab-rows sets how many (a random subset here).
    used = torch.randperm(50257, generator=torch.Generator().manual_seed(0))[:vocab_rows].sort().values
    return (
        ("ViT CIFAR 6/256/512/8", cifar_vit, None),
        (f"GPT-2 BookCorpus 6/512/2048/8, {vocab_rows} vocabulary rows", bookcorpus_gpt2, used),
        ("GPT-2 BookCorpus 6/512/2048/8, all 50257 rows", bookcorpus_gpt2, None),
    )


# the search's own stopping rule, as the pipeline runs it (the earlier code's default too)
DEFAULT_TOL = 1e-6


def worker(args: argparse.Namespace) -> None:
    """One side of --against: every pair at the forced iterations and at the default tolerance, with
    only the arguments every version of weight_matching takes; one JSON line of seconds."""
    import glmc

    here = Path(glmc.__file__).resolve()
    if Path(args.worker).resolve() not in here.parents:
        raise SystemExit(f"--worker {args.worker}: glmc was imported from {here} instead")
    out = {}
    for name, build, tokens in paper_pairs(args.vocab_rows):
        a, b = to_canonical(build(0)), to_canonical(build(1))
        for tol, label in ((-float("inf"), f"{args.iterations} iterations"), (DEFAULT_TOL, "default tolerance")):
            seconds, iterations = [], 0
            for _ in range(args.repeats):
                start = time.perf_counter()
                _, diag = weight_matching(a, b, "orthogonal", max_iter=args.iterations, tol=tol, tokens=tokens)
                seconds.append(time.perf_counter() - start)
                iterations = len(diag["objective"]) - 1
            out[f"{name} | {label}"] = {"seconds": seconds, "iterations": iterations}
    print(json.dumps(out))


def side_by_side(args: argparse.Namespace) -> None:
    """--against: alternate processes of the earlier tree and this one, then medians and ratios."""
    trees = {"earlier": Path(args.against).resolve() / "src", "now": Path(__file__).resolve().parents[1] / "src"}
    for tree in trees.values():
        if not (tree / "glmc").is_dir():
            raise SystemExit(f"--against: no glmc package under {tree}")
    command = [sys.executable, __file__, "--repeats", str(args.repeats), "--iterations", str(args.iterations)]
    command += ["--vocab-rows", str(args.vocab_rows)]
    seconds: dict[str, dict[str, list[float]]] = {}
    iterations: dict[str, dict[str, int]] = {}
    for round_ in range(args.rounds):
        for side, src in trees.items():
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])}
            done = subprocess.run(
                [*command, "--worker", str(src)], env=env, capture_output=True, text=True, check=False
            )
            if done.returncode != 0:
                raise SystemExit(f"{side} tree ({src}) failed:\n{done.stderr[-2000:]}")
            for case, r in json.loads(done.stdout.strip().splitlines()[-1]).items():
                seconds.setdefault(case, {}).setdefault(side, []).extend(r["seconds"])
                iterations.setdefault(case, {})[side] = r["iterations"]
        print(f"round {round_ + 1} of {args.rounds} done", flush=True)
    print(f"{args.against} (earlier) against this tree, median over {args.rounds} rounds x {args.repeats} runs:")
    for case, by_side in seconds.items():
        earlier, now = (statistics.median(by_side[k]) for k in ("earlier", "now"))
        its = iterations[case]
        print(
            f"{case}: earlier {earlier:.2f} s ({its['earlier']} iterations), now {now:.2f} s "
            f"({its['now']} iterations), {earlier / now:.2f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=15)
    parser.add_argument("--vocab-rows", type=int, default=30000, help="GPT-2 ids kept by the restriction")
    parser.add_argument("--against", metavar="TREE", help="an earlier checkout to time beside this one")
    parser.add_argument("--rounds", type=int, default=4, help="--against: alternations of the two trees")
    parser.add_argument("--worker", metavar="SRC", help=argparse.SUPPRESS)  # one side of --against
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    if args.against:
        return side_by_side(args)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.iterations} iterations, "
        f"median of {args.repeats}"
    )
    for name, build, tokens in paper_pairs(args.vocab_rows):
        r = measure(build, args.repeats, args.iterations, tokens)
        parts = ", ".join(f"{k} {v:.3f} s" for k, v in r.items() if k != "median_s")
        print(f"{name}: {r['median_s']:.3f} s per pair ({parts})")
        if name.startswith("ViT"):
            print(f"  ratio to the 1 s target: {r['median_s'] / 1.0:.2f}x")
        # the same solutions by the earlier path: every product every iteration, one layer at a time
        earlier = measure(build, args.repeats, args.iterations, tokens, threads=1, reuse=False)
        parts = ", ".join(f"{k} {v:.3f} s" for k, v in earlier.items() if k != "median_s")
        print(f"  earlier path: {earlier['median_s']:.3f} s ({parts}); {earlier['median_s'] / r['median_s']:.2f}x")


if __name__ == "__main__":
    main()
