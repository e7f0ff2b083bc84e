"""Weight matching against the machine's floor: per iteration, its seconds beside what the products cost
at the matrix-multiply rate this process measures, plus the assignments' seconds.

    .venv/bin/python benchmarks/weight_floor.py [--shapes gpt2-124m pythia-410m llama-1.1b] [--layers N]
        [--iterations N] [--vocab-rows 30000] [--device auto|cpu|cuda] [--threads N]

Shapes (random weights, seeds 0 and 1, float32; built as benchmarks/scale.py builds them):
  gpt2-124m    width 768, 12 layers of 12 heads, MLP 3072, vocabulary 50257
  pythia-410m  GPT-NeoX: width 1024, 24 layers of 16 heads, MLP 4096, rotary on a quarter of each head,
               vocabulary 50304
  llama-1.1b   TinyLlama's shape: width 2048, 22 layers of 32 query and 4 key/value heads, gated MLP 5632,
               vocabulary 32000
--layers N cuts every shape to N layers; without it a shape whose two models and the search's working set
(about five copies of B's layer weights at the peak) would not fit the memory available is cut to the
layers that do, and the output says so.

Per shape, weight matching runs exactly --iterations iterations (tol=-inf) twice: once timed, once under
a dispatch mode that counts the floating-point operations of every matrix product (mm, bmm, addmm,
baddbmm and the einsums that lower to them; decompositions are not counted) by dtype. Reported per
iteration (the setup that computes the embeddings' share once is left out): wall seconds; the products'
GFLOP in float32 and float64 and their seconds at the rates a float32 and a float64 GEMM of the MLP
similarity's size reach in this process; the assignments' seconds (SciPy's solvers, the device's auction
and the certificates, overlapping threads counted once); the floor = products at the measured rate +
assignments; and the ratio seconds / floor (the rates measured before and after the runs, the faster
kept); per step, its seconds beside its products at that rate, and the decompositions' seconds (polar
factors, spectral bounds: not in the floor). Then the peak memory above the two models (resident memory
on the host, allocated memory on a CUDA device). On a shared machine every figure is an upper bound.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
import scale  # noqa: E402  (benchmarks/scale.py: the shapes, the builders, the memory readings)

from glmc.matching import weight  # noqa: E402
from glmc.matching.engine import assignment, device_assignment, warm_assignment  # noqa: E402
from glmc.matching.weight import weight_matching  # noqa: E402
from glmc.symmetry import groups  # noqa: E402

GIB = 2**30
COPIES = 5  # B's layer weights held at the search's peak (its own, A's, three transformed)


def pythia_config(layers: int, vocab: int, width: int = 1024, heads: int = 16, **extra) -> GPTNeoXConfig:
    """A Pythia-shaped GPT-NeoX config (410M's width by default; 160M: width 768, 12 heads): MLP four times
    the width, rotary on a quarter of each head, parallel residual, untied head."""
    return GPTNeoXConfig(
        hidden_size=width,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * width,
        vocab_size=vocab,
        max_position_embeddings=2048,
        use_parallel_residual=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        tie_word_embeddings=False,
        **extra,
    )


class PythiaShape(scale.Shape):
    def config(self, layers: int, vocab: int):
        return pythia_config(layers, vocab)

    def hf_class(self):
        return GPTNeoXForCausalLM


SHAPES = {
    "gpt2-124m": scale.SHAPES["gpt2-124m"],
    "pythia-410m": PythiaShape("pythia-410m", 24, 50304, 15),
    "llama-1.1b": scale.SHAPES["llama-1.1b"],
}
# the MLP similarity's product per shape: (units, 2 * width + 1), the GEMM whose rate is measured
GEMM = {"gpt2-124m": (3072, 1537), "pythia-410m": (4096, 2049), "llama-1.1b": (5632, 4097)}

MATMULS = {"mm": (0, 1), "addmm": (1, 2), "bmm": (0, 1), "baddbmm": (1, 2)}


class ProductFlops(TorchDispatchMode):
    """Counts 2 m n k per matrix product, by the iteration step running and dtype, while `step` is set."""

    def __init__(self):
        super().__init__()
        self.flops: dict[tuple[str, torch.dtype], float] = defaultdict(float)
        self.step: str | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if self.step is not None and name in MATMULS:
            first, second = (args[i] for i in MATMULS[name])
            batch = first.shape[0] if first.dim() == 3 else 1
            m, k, n = first.shape[-2], first.shape[-1], second.shape[-1]
            self.flops[self.step, first.dtype] += 2.0 * batch * m * n * k
        return func(*args, **(kwargs or {}))


class Intervals:
    """Wall-clock intervals of calls from any thread; their union's length (overlap counted once)."""

    def __init__(self):
        self.spans: list[tuple[float, float]] = []
        self.lock = threading.Lock()
        self.depth = threading.local()
        self.recording = False

    def wrap(self, fn):
        def timed(*args, **kwargs):
            depth = getattr(self.depth, "n", 0)
            if depth or not self.recording:  # a solver called inside another is counted once
                return fn(*args, **kwargs)
            self.depth.n = 1
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.depth.n = 0
                with self.lock:
                    self.spans.append((start, time.perf_counter()))

        return timed

    def seconds(self) -> float:
        total, end = 0.0, -float("inf")
        for a, b in sorted(self.spans):
            if b > end:
                total += b - max(a, end)
                end = b
        return total


class Probe:
    """What the instrumented code reports to: the solvers' and decompositions' intervals, and the product
    counter of a counting run (None in the timed run)."""

    def __init__(self):
        self.solvers = Intervals()
        self.decompositions = Intervals()
        self.flops: ProductFlops | None = None


PROBE = Probe()


class _Named:
    """An iteration step that tells the product counter its name while it runs."""

    def __init__(self, step):
        self.step, self.name = step, step.name

    def __call__(self, *args):
        if PROBE.flops is not None:
            PROBE.flops.step = self.name or "other"
        try:
            return self.step(*args)
        finally:
            if PROBE.flops is not None:
                PROBE.flops.step = "objective"  # what the iteration runs after its steps


def instrument() -> None:
    """Time the assignment solvers and the decompositions, and count products by step, only inside the
    iterations (not the setup)."""
    wrap = PROBE.solvers.wrap
    groups.linear_sum_assignment = wrap(groups.linear_sum_assignment)
    warm_assignment.fresh_assignment = wrap(warm_assignment.fresh_assignment)
    warm_assignment.WarmAssignments._certify = wrap(warm_assignment.WarmAssignments._certify)
    device_assignment.auction_assignment = wrap(device_assignment.auction_assignment)
    assignment.device_project = wrap(assignment.device_project)
    for name in ("eigh", "svd", "eigvalsh"):
        setattr(torch.linalg, name, PROBE.decompositions.wrap(getattr(torch.linalg, name)))
    iteration = weight._iteration

    def counted(steps, *args, **kwargs):
        PROBE.solvers.recording = PROBE.decompositions.recording = True
        if PROBE.flops is not None:
            PROBE.flops.step = "objective"
        try:
            return iteration([_Named(step) for step in steps], *args, **kwargs)
        finally:
            PROBE.solvers.recording = PROBE.decompositions.recording = False
            if PROBE.flops is not None:
                PROBE.flops.step = None

    weight._iteration = counted


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def gemm_rate(shape: tuple[int, int], dtype: torch.dtype, device: torch.device, repeats: int = 3) -> float:
    """FLOP/s of the best of `repeats` products (units x k) @ (k x units) in `dtype` on `device`."""
    units, k = shape
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(units, k, dtype=dtype, device=device, generator=g)
    b = torch.randn(k, units, dtype=dtype, device=device, generator=g)
    a @ b  # warm-up
    sync(device)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        sync(device)
        best = min(best, time.perf_counter() - start)
    return 2.0 * units * units * k / best


def available_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable"))


def layers_that_fit(shape: scale.Shape, vocab: int, device: torch.device) -> int:
    """The most layers whose two models and COPIES of B's layer weights fit 80 % of the free memory."""
    whole = scale.full_params(shape, shape.layers, vocab)
    outside = scale.full_params(shape, 0, vocab) if shape.name != "llama-1.1b" else scale.full_params(shape, 1, vocab)
    per_layer = (whole - outside) / shape.layers
    budget = 0.8 * available_bytes(device) / 4 - 2 * outside  # float32 parameters
    return max(1, min(shape.layers, int(budget / ((2 + COPIES) * per_layer))))


def peak_reader(device: torch.device):
    """(reset, peak above the level at reset in bytes, whether the reset took)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        return lambda: torch.cuda.max_memory_allocated(device) - base, True
    took = scale.reset_peak()
    base = scale.rss()
    return lambda: scale.peak_rss() - base, took


def run(shape: scale.Shape, layers: int | None, iterations: int, vocab_rows: int, device: torch.device) -> None:
    cut = layers if layers is not None else layers_that_fit(shape, shape.vocab, device)
    note = (
        ""
        if cut == shape.layers
        else f" -- CUT to {cut} of {shape.layers} layers"
        + (" (--layers)" if layers is not None else " (the memory available holds no more)")
    )
    print(f"\n== {shape.name}{note}")
    a, b, count = scale.build_pair(shape, cut, shape.vocab, stash=False)
    a, b = a.to(device), b.to(device)
    print(f"parameters: {count:,} (Hugging Face, as cut); two models {scale.gib(2 * scale.size(a))} on {device}")
    rows = shape.vocab if vocab_rows <= 0 or vocab_rows >= shape.vocab else vocab_rows
    tokens = torch.randperm(shape.vocab, generator=torch.Generator().manual_seed(0))[:rows].sort().values
    gemm = GEMM[shape.name]
    # the rates before and after the runs, the faster kept: on a shared machine the floor is then the lowest
    # one seen and the ratio an upper bound
    rates = {dt: gemm_rate(gemm, dt, device) for dt in (torch.float32, torch.float64)}
    PROBE.solvers.spans.clear()
    PROBE.decompositions.spans.clear()
    scale.trim()
    peak, took = peak_reader(device)
    _, diag = weight_matching(a, b, "orthogonal", max_iter=iterations, tol=-float("inf"), tokens=tokens, device=device)
    sync(device)
    above = peak()
    seconds = sum(diag["seconds_by_iteration"]) / iterations
    solver_s = PROBE.solvers.seconds() / iterations
    decomposition_s = PROBE.decompositions.seconds() / iterations
    print(
        f"  timed: {seconds:.3f} s per iteration, assignments {solver_s:.3f} s, decompositions "
        f"{decomposition_s:.3f} s, {scale.gib(above)} above the two models (the products are counted next)",
        flush=True,
    )
    # dispatch modes see only this thread: the counting run solves the layers one after another (the same
    # products)
    PROBE.flops = ProductFlops()
    with PROBE.flops:
        weight_matching(
            a, b, "orthogonal", max_iter=iterations, tol=-float("inf"), tokens=tokens, device=device, threads=1
        )
    counter, PROBE.flops = PROBE.flops, None
    rates = {dt: max(rate, gemm_rate(gemm, dt, device)) for dt, rate in rates.items()}
    at_rate = defaultdict(float)  # per step, its products' seconds at the measured rates
    for (step, dt), flops in counter.flops.items():
        at_rate[step] += flops / rates.get(dt, rates[torch.float32]) / iterations
    product_s = sum(at_rate.values())
    floor = product_s + solver_s
    print(
        f"{iterations} iterations, {rows} of {shape.vocab} vocabulary rows, on {device} "
        f"(load average now {os.getloadavg()[0]:.2f}):"
    )
    print(
        f"  GEMM {gemm[0]}x{gemm[1]} @ {gemm[1]}x{gemm[0]}, the faster of before and after: "
        f"float32 {rates[torch.float32] / 1e9:.1f} GFLOP/s, "
        f"float64 {rates[torch.float64] / 1e9:.1f} GFLOP/s"
    )
    per = defaultdict(float)
    for (_, dt), flops in counter.flops.items():
        per[str(dt).removeprefix("torch.")] += flops / iterations / 1e9
    print("  products per iteration: " + ", ".join(f"{dt} {v:.2f} GFLOP" for dt, v in per.items()))
    print(f"  {'seconds':>10}{'products':>10}{'assign':>10}{'floor':>10}{'ratio':>8}{'assign share':>14}")
    print(
        f"  {seconds:>10.3f}{product_s:>10.3f}{solver_s:>10.3f}{floor:>10.3f}{seconds / floor:>7.2f}x"
        f"{solver_s / seconds:>13.0%}"
    )
    print(f"  of the rest: decompositions (eigh, SVD; not in the floor) {decomposition_s:.3f} s per iteration")
    print("  per step and iteration: seconds / products at the measured rate")
    for step, spent in diag["seconds_by_step"].items():
        print(f"    {step:<10}{spent / iterations:>9.3f}{at_rate.get(step, 0.0):>9.3f}")
    where = "" if took else " (peak not reset: includes building the models)"
    print(f"  peak memory above the two models: {scale.gib(above)}{where}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--layers", type=int, help="cut every shape to this many layers")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--vocab-rows", type=int, default=30000, help="token ids kept by the restriction (0: all)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: CUDA where visible")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    auto = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and auto != "cuda":
        print("weight_floor: --device cuda but torch sees no CUDA device here: use --device cpu or auto")
        sys.exit(2)
    device = torch.device(auto if args.device == "auto" else args.device)
    print(scale.machine() + (f"; {torch.cuda.get_device_name(device)}" if device.type == "cuda" else ""))
    print(f"load average {os.getloadavg()[0]:.2f} over {os.cpu_count()} cores")
    instrument()
    for name in args.shapes:
        run(SHAPES[name], args.layers, args.iterations, args.vocab_rows, device)


if __name__ == "__main__":
    main()
