"""SciPy's Hungarian solver on the host against the certified auction of glmc.matching.engine.device_assignment.

    .venv/bin/python benchmarks/assignment_solver.py [--repeats 3] [--sizes 64 256 1024] [--batch 32x64]
        [--threads 1]

Problems: one of each size and a batch of small ones (the many head problems of a layer), of two kinds:
`uniform`, random float32 matrices in [0, 1) (the hard case for an auction: no row prefers one column by
much), and `latent`, a permutation plus 0.3 N(0, 1) noise (a straight-through latent some way into
training, whose rows' maxima collide so that it needs a solver). Per problem and device, the medians
over `--repeats` of: SciPy on the host, the matrix copied there first as
Permutation.project does (a batch: one solve after another); the auction on the device from cold; and
the auction warm-started from its own answer's prices after the matrix moved by N(0, 1e-3) per entry (a
learned-matching step), SciPy timed on the moved matrix too. Ratios are the auction's seconds over
SciPy's in the same run; `rounds` counts bidding rounds (cold / warm) and `fallback` the problems whose
certificate failed, which SciPy then solved on the host. Runs on the CPU, and on CUDA where visible.
One CPU thread by default, as SciPy's solver runs: the auction's small operations gain nothing from more
(on a 2-core machine shared with other jobs, two threads made them seven times slower).
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import time

import torch
from scipy.optimize import linear_sum_assignment

from glmc.matching.engine.device_assignment import auction_assignment


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def scipy_seconds(s: torch.Tensor) -> float:
    """Seconds of SciPy's solves of every problem of s, the copy to the host included."""
    synchronize(s.device)
    start = time.perf_counter()
    host = s.reshape(-1, s.shape[-1], s.shape[-1]).cpu().double().numpy()
    for problem in host:
        linear_sum_assignment(problem, maximize=True)
    return time.perf_counter() - start


def auction_seconds(s: torch.Tensor, prices=None, perm=None):
    """(seconds, the answer) of the auction on s's device."""
    synchronize(s.device)
    start = time.perf_counter()
    found = auction_assignment(s, prices, perm)
    synchronize(s.device)
    return time.perf_counter() - start, found


def problem(kind: str, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    if kind == "uniform":
        return torch.rand(shape, generator=g)
    n, count = shape[-1], math.prod(shape[:-2])
    perms = torch.stack([torch.randperm(n, generator=g) for _ in range(count)])
    return (torch.eye(n)[perms] + 0.3 * torch.randn(count, n, n, generator=g)).reshape(shape)


def measure(kind: str, shape: tuple[int, ...], device: torch.device, repeats: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    s = problem(kind, shape, g)
    moved = s + 1e-3 * torch.randn(shape, generator=g)
    s, moved = s.to(device), moved.to(device)
    auction_assignment(s[..., :8, :8])  # first calls pay for allocations and kernel loading
    times: dict[str, list[float]] = {"scipy": [], "cold": [], "scipy_moved": [], "warm": []}
    for _ in range(repeats):
        times["scipy"].append(scipy_seconds(s))
        seconds, cold = auction_seconds(s)
        times["cold"].append(seconds)
        times["scipy_moved"].append(scipy_seconds(moved))
        seconds, warm = auction_seconds(moved, cold.prices, cold.perm)
        times["warm"].append(seconds)
    out = {k: statistics.median(v) for k, v in times.items()}
    out["rounds"] = f"{cold.rounds} / {warm.rounds}"
    out["fallback"] = len(cold.fallback) + len(warm.fallback)
    out["problems"] = 2 * (s.numel() // (shape[-1] * shape[-1]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--batch", default="32x64", help="BxN: B problems of N units")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (SciPy's solver uses one)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    b, n = (int(x) for x in args.batch.split("x"))
    shapes = [(size, size) for size in args.sizes] + [(b, n, n)]
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, median of {args.repeats}")
    columns = ("problem", "kind", "device", "SciPy", "auction cold", "ratio", "SciPy, moved", "auction warm", "ratio")
    print("| " + " | ".join((*columns, "rounds", "fallback")) + " |")
    print("| --- " * (len(columns) + 2) + "|")
    for device, kind, shape in itertools.product(devices, ("uniform", "latent"), shapes):
        r = measure(kind, shape, device, args.repeats)
        name = "x".join(str(d) for d in shape[:-1])
        print(
            f"| {name} | {kind} | {device.type} | {r['scipy'] * 1e3:.2f} ms | {r['cold'] * 1e3:.1f} ms | "
            f"{r['cold'] / r['scipy']:.1f}x | {r['scipy_moved'] * 1e3:.2f} ms | {r['warm'] * 1e3:.1f} ms | "
            f"{r['warm'] / r['scipy_moved']:.1f}x | {r['rounds']} | {r['fallback']} of {r['problems']} |"
        )


if __name__ == "__main__":
    main()
