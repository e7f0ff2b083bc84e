"""Pythia-160M end to end on the host: two save_pretrained folders through run.py with methods vanilla and
weight on 11 points, against the floor, the models' memory and the gap between progress lines.

    .venv/bin/python benchmarks/pythia160m_end_to_end.py [--layers N] [--windows N] [--folder DIR]

Writes into --folder (default: a temporary folder) two GPTNeoXForCausalLM folders of Pythia-160M's shape
(width 768, --layers of 12 heads, default 12; MLP 3072; rotary on a quarter of each head; vocabulary
50304; untied embed_out; random weights from seeds 0 and 1, float32) with a byte-level BPE tokenizer
trained on the text, and a text file whose test block holds --windows windows of 128 tokens (default 8: one
batch, which puts the run at 3-6 minutes on 2 cores). Then runs

    run.py endpoints=pretrained endpoints.paths=[a,b] data=text_file data.path=<text> matcher=weight
        matcher.methods=[vanilla,weight] eval.num_lambdas=11 data.limit_test=<windows> logger=none

in a subprocess, its output not on a terminal (progress is written as log lines), timestamping every
line and sampling its resident memory (/proc/<pid>/status, every 0.2 s). Reported:

  seconds   the run's wall time (the subprocess, start to exit)
  floor     the path's forwards plus weight matching's floor, at the matrix-multiply rates this process
            measures on the run's torch threads (its glmc.threads line) after the run, twice, the faster
            kept (float32: the faster of a forward's MLP product and weight matching's MLP similarity;
            float64: the similarity): every evaluated forward's products, counted per token with
            benchmarks/weight_floor.py's dispatch counter (attention's two products included) on the Hugging
            Face and the canonical forward (the endpoints' test losses and vanilla's 11 points on the
            Hugging Face models, weight's 11 on the canonical ones: its 9 inside with qk and vo merged as
            circuits, both ends' heads side by side, as the run merges them; per method the aligned end's
            and B's logits on the first batch); plus weight matching run here as the run ran it (its iterations, the
            same vocabulary rows, read from its data as its saved config builds them: which rows decides
            the path of the search and so how many assignments are solved afresh; B's transformed copies
            held whole, so the layers the run transforms again as it reads them count once): its products
            counted the same way, and its assignments' seconds (SciPy's solvers and the certificates, timed
            by weight_floor.instrument; this counting run solves the layers on one thread, so they are
            summed, never overlapped)
  peak      the run's resident memory above its level just before the first folder is loaded (the line
            naming the folder's load), against the two models' float32 bytes; with when it came, the line
            before it and how much of it was file-backed (the folders' weights, which transformers maps)
  gap       the longest time between two of the run's output lines (ended by a newline: a progress bar's
            rewrites of its line do not count) from the folders' load to its end

On a shared machine every figure is an upper bound: run it with nothing else busy.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
import scale  # noqa: E402  (the machine's description, memory readings)
import weight_floor  # noqa: E402  (the product counter, the GEMM rate, the solvers' timing)

from glmc.data.pydoc_corpus import pydoc_text  # noqa: E402
from glmc.interpolation import merge_params  # noqa: E402
from glmc.matching.weight import weight_matching  # noqa: E402
from glmc.models.canonical import canonical_forward  # noqa: E402
from glmc.symmetry import apply  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SEQ_LEN = 128
LAMBDAS = 11
METHODS = ("vanilla", "weight")
VOCAB = 50304
TOKENIZER_VOCAB = 4096
SAMPLE_S = 0.2
MARKER = ": loading its GPTNeoXForCausalLM weights"  # the run's line as it starts loading the first folder
GIB = 2**30
CIRCUITS = ("qk", "vo")  # how matcher=weight interpolates heads by default (qk=circuit, vo=circuit)


def pythia_config(layers: int) -> GPTNeoXConfig:
    return weight_floor.pythia_config(layers, VOCAB, width=768, heads=12, architectures=["GPTNeoXForCausalLM"])


def bpe_tokenizer(text_file: Path):
    """A byte-level BPE tokenizer (GPT-NeoX's kind) trained on the text file, as a fast HF tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TOKENIZER_VOCAB, special_tokens=["<|endoftext|>"], show_progress=False)
    tok.train([str(text_file)], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>")


def write_inputs(folder: Path, layers: int, windows: int) -> tuple[list[Path], Path]:
    """The two model folders and the text file (its test block: 5 % of it, about `windows` x SEQ_LEN tokens
    and some to spare)."""
    folder.mkdir(parents=True, exist_ok=True)
    text_file = folder / "text.txt"
    corpus = pydoc_text()
    # about 3.5 characters a token once the tokenizer is trained; the test block is the last 5 %
    wanted = int(windows * SEQ_LEN * 4.5 / 0.05)
    text_file.write_text((corpus * (wanted // len(corpus) + 1))[:wanted], encoding="utf-8")
    tokenizer = bpe_tokenizer(text_file)
    test = text_file.read_text(encoding="utf-8")[int(wanted * 0.95) :]
    if len(tokenizer(test)["input_ids"]) < windows * (SEQ_LEN + 1):
        raise SystemExit(f"the text's test block holds fewer than {windows} windows: raise `wanted` in write_inputs")
    paths = []
    for seed in (0, 1):
        path = folder / f"pythia160m_seed{seed}"
        config = path / "config.json"
        if not config.is_file() or json.loads(config.read_text())["num_hidden_layers"] != layers:
            torch.manual_seed(seed)
            GPTNeoXForCausalLM(pythia_config(layers)).save_pretrained(path)
        tokenizer.save_pretrained(path)
        paths.append(path)
    return paths, text_file


class Watched:
    """A subprocess whose output lines are timestamped and whose resident memory is sampled."""

    def __init__(self, command: list[str], log_file: Path):
        self.start = time.perf_counter()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        # bytes: a line ends at a newline only (a progress bar's carriage returns rewrite one line)
        self.proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        self.lines: list[tuple[float, str]] = []
        self.samples: list[tuple[float, int]] = []
        self.log = log_file.open("w", encoding="utf-8")
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for raw in self.proc.stdout:
            at = time.perf_counter() - self.start
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n").rsplit("\r", 1)[-1]
            self.lines.append((at, line))
            self.log.write(f"[{at:8.2f}] {line}\n")
            self.log.flush()

    def _rss(self) -> tuple[int, int] | None:
        """(resident bytes, of them file-backed: mapped safetensors weights)."""
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                fields = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if line.startswith("Rss")}
            return sum(fields.values()), fields.get("RssFile", 0)
        except (OSError, ValueError, IndexError):
            return None

    def wait(self) -> tuple[int, float]:
        while self.proc.poll() is None:
            rss = self._rss()
            if rss is not None:
                self.samples.append((time.perf_counter() - self.start, *rss))
            time.sleep(SAMPLE_S)
        seconds = time.perf_counter() - self.start
        self.reader.join()
        self.log.close()
        return self.proc.returncode, seconds


def baseline_and_peak(watched: Watched, marker: str) -> tuple[float, int, tuple[float, int, int]]:
    """(when the line naming `marker` came, resident memory last sampled before it, the peak sample after it:
    (time, resident bytes, of them file-backed))."""
    at = next((t for t, line in watched.lines if marker in line), None)
    if at is None:
        raise SystemExit(f"the run printed no line with {marker!r}: see its log for what it printed instead")
    before = [rss for t, rss, _ in watched.samples if t <= at]
    peak = max((s for s in watched.samples if s[0] >= at), key=lambda s: s[1])
    return at, before[-1] if before else watched.samples[0][1], peak


def line_before(watched: Watched, when: float) -> str:
    """The run's last output line before `when`."""
    return next((line for t, line in reversed(watched.lines) if t <= when and line.strip()), "")


def longest_gap(watched: Watched, since: float) -> tuple[float, str]:
    """The longest time between two output lines after `since` (the last line to the exit counts too)."""
    times = [t for t, _ in watched.lines if t >= since] + [watched.samples[-1][0] if watched.samples else since]
    gaps = [(b - a, i) for i, (a, b) in enumerate(zip(times, times[1:]))]
    gap, i = max(gaps) if gaps else (0.0, 0)
    lines = [line for t, line in watched.lines if t >= since]
    return gap, lines[i] if i < len(lines) else ""


def composite_flops(name: str, args) -> float:
    """2 m n k of the products that inference mode hands the dispatcher whole (linear, matmul) and
    attention's two products (scores and their values, 4 b h s s' d); 0 for anything else."""
    if name == "linear":
        x, w = args[0], args[1]
        return 2.0 * x.numel() / x.shape[-1] * w.shape[0] * w.shape[1]
    if name == "matmul":
        a, b = args[0], args[1]
        if a.dim() < 2 or b.dim() < 2:
            return 2.0 * a.numel() * (b.numel() // a.shape[-1] if a.dim() == 1 else b.numel() // b.shape[0])
        batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]).numel()
        return 2.0 * batch * a.shape[-2] * a.shape[-1] * b.shape[-1]
    if name.startswith(("scaled_dot_product", "_scaled_dot_product")):
        q, k = args[0], args[1]
        return 4.0 * q.numel() * k.shape[-2]
    return 0.0


class AllProducts(weight_floor.ProductFlops):
    """The product counter, also counting outside weight matching's iterations (its setup, the transform's
    application) under the step "outside", and the products inference mode dispatches whole."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        extra = composite_flops(func.overloadpacket.__name__, args)
        if extra:
            self.flops[self.step or "outside", args[0].dtype] += extra
            return func(*args, **(kwargs or {}))
        if self.step is not None:
            return super().__torch_dispatch__(func, types, args, kwargs)
        self.step = "outside"
        try:
            return super().__torch_dispatch__(func, types, args, kwargs)
        finally:
            self.step = None


def canonical_pair(paths: list[Path]):
    """The two folders' models in canonical form (Hugging Face models freed)."""
    models = []
    for path in paths:
        hf = GPTNeoXForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        models.append(scale.canonical(hf))
        del hf
    gc.collect()
    return models


def forward_flops_per_token(path: Path) -> tuple[float, float, float]:
    """Matrix-product FLOPs per token of one forward of the Hugging Face model, of its canonical form and of
    a point inside weight's path (qk and vo merged as circuits: both ends' heads side by side), counted on
    one window."""
    model = GPTNeoXForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    canonical = scale.canonical(model)
    inputs = torch.randint(0, TOKENIZER_VOCAB, (1, SEQ_LEN), generator=torch.Generator().manual_seed(0))
    params = canonical.params()
    inside = merge_params([params, params], [0.5, 0.5], CIRCUITS)
    forwards = (
        lambda: model(inputs).logits,
        lambda: canonical_forward(canonical.config, params, inputs),
        lambda: canonical_forward(canonical.config, inside, inputs),
    )
    counts = []
    for forward in forwards:
        counter = AllProducts()
        with torch.no_grad(), counter:  # inference mode would hand some einsums over whole, uncounted
            forward()
        counts.append(sum(counter.flops.values()) / inputs.numel())
    return counts[0], counts[1], counts[2]


def run_tokens(run_dir: Path, rows: int | None) -> torch.Tensor | None:
    """The vocabulary rows the run compared: the ids its training data holds, from its data as its saved
    config builds them (None where it compared all rows); checked against the count the run reported."""
    if rows is None:
        return None
    from omegaconf import OmegaConf

    from glmc.data.module import DataModule
    from glmc.matching.base import MatchContext
    from glmc.pipeline.hf_folders import evaluation_config

    data = DataModule(evaluation_config(OmegaConf.load(run_dir / ".hydra" / "config.yaml")).data, seed=0)
    data.setup()
    tokens = MatchContext(data=data).token_ids(VOCAB)
    if tokens.numel() != rows:
        raise SystemExit(f"the run compared {rows} vocabulary rows, its data here gives {tokens.numel()}")
    return tokens


def matching_floor(
    paths: list[Path], iterations: int, tokens: torch.Tensor | None
) -> tuple[dict[torch.dtype, float], float]:
    """Weight matching as the run made it (its iterations, its vocabulary rows), run here once: its
    products' FLOPs by dtype (setup and the transform's application included) and its assignments' seconds.
    Dispatch modes see only this thread, so this run solves the layers one after another (threads=1): the
    assignments' seconds are then their sum, not their union over threads (the floor is the higher)."""
    a, b = canonical_pair(paths)
    weight_floor.instrument()
    probe = weight_floor.PROBE
    probe.solvers.spans.clear()
    probe.flops = AllProducts()
    with probe.flops:
        # B's transformed copies held whole: the search's own products, not the layer-by-layer
        # recomputation a large run trades for memory (the stricter floor)
        options = dict(max_iter=iterations, tol=-float("inf"), tokens=tokens, threads=1, layerwise=False)
        transform, _ = weight_matching(a, b, "orthogonal", **options)
        apply(transform, b)
    counter, probe.flops = probe.flops, None
    by_dtype: dict[torch.dtype, float] = {}
    for (_, dt), flops in counter.flops.items():
        by_dtype[dt] = by_dtype.get(dt, 0.0) + flops
    return by_dtype, probe.solvers.seconds()


def rates(threads: int) -> dict[torch.dtype, float]:
    """FLOP/s of float32 products (the faster of a forward's MLP shape and weight matching's MLP
    similarity) and of float64 ones (the similarity's shape), on `threads` torch threads."""
    cpu, before = torch.device("cpu"), torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        shapes = ((3072, 768), (3072, 1537))
        return {
            torch.float32: max(weight_floor.gemm_rate(shape, torch.float32, cpu) for shape in shapes),
            torch.float64: weight_floor.gemm_rate((3072, 1537), torch.float64, cpu),
        }
    finally:
        torch.set_num_threads(before)


def run_threads(watched: Watched) -> int:
    """The torch threads the run chose (its glmc.threads line), else this process's count."""
    for _, line in watched.lines:
        found = re.search(r"the run: (\d+) torch thread", line)
        if found:
            return int(found.group(1))
    return torch.get_num_threads()


def command(paths: list[Path], text_file: Path, windows: int, run_dir: Path) -> list[str]:
    return [
        sys.executable,
        "run.py",
        "endpoints=pretrained",
        f"endpoints.paths=[{','.join(str(p) for p in paths)}]",
        "data=text_file",
        f"data.path={text_file}",
        f"data.seq_len={SEQ_LEN}",
        f"data.limit_test={windows}",
        "matcher=weight",
        f"matcher.methods=[{','.join(METHODS)}]",
        f"eval.num_lambdas={LAMBDAS}",
        "logger=none",
        f"hydra.run.dir={run_dir}",
        "overwrite=true",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12, help="layers of each model (Pythia-160M: 12)")
    parser.add_argument("--windows", type=int, default=8, help=f"test windows of {SEQ_LEN} tokens evaluated")
    parser.add_argument("--folder", type=Path, help="where the folders, the text and the run go (default: temporary)")
    args = parser.parse_args()
    print(scale.machine())
    print(f"load average {os.getloadavg()[0]:.2f} over {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.folder or Path(tmp)
        measure(folder, args.layers, args.windows)


def measure(folder: Path, layers: int, windows: int) -> None:
    paths, text_file = write_inputs(folder, layers, windows)
    run_dir = folder / "run"
    argv = command(paths, text_file, windows, run_dir)
    print(f"evaluation: {windows} windows of {SEQ_LEN} tokens = {windows * SEQ_LEN} tokens per forward pass")
    print("command: " + " ".join(argv[1:]))
    watched = Watched(argv, folder / "run.log")
    code, seconds = watched.wait()
    if code != 0:
        tail = "\n".join(line for _, line in watched.lines[-30:])
        raise SystemExit(f"run.py exited with status {code}; its last lines:\n{tail}")
    results = json.loads((run_dir / "results.json").read_text())
    with (folder / "memory.csv").open("w", encoding="utf-8") as f:  # the sampled resident memory, to plot
        f.write("seconds,resident_bytes,file_backed_bytes\n")
        f.writelines(f"{t:.2f},{rss},{file}\n" for t, rss, file in watched.samples)
    report(paths, watched, seconds, results, windows, run_dir)


def model_bytes(path: Path) -> int:
    """A folder's weights in float32 bytes, from its safetensors header."""
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        return sum(4 * torch.Size(f.get_slice(name).get_shape()).numel() for name in f.keys())


def report(paths, watched, seconds, results, windows, run_dir) -> None:
    pair = results["methods"]["weight"]["pairs"][0]
    diag = pair["diagnostics"]
    iterations, rows = len(diag["seconds_by_iteration"]), diag.get("vocabulary_rows")
    threads = run_threads(watched)
    before = rates(threads)
    hf_flops, canonical_flops, inside_flops = forward_flops_per_token(paths[0])
    products, solver_s = matching_floor(paths, iterations, run_tokens(run_dir, rows))
    rate = {dt: max(r, now) for (dt, r), now in zip(before.items(), rates(threads).values())}
    tokens = windows * SEQ_LEN
    first = min(windows, 64) * SEQ_LEN  # the evaluator's first batch (data.eval_batch_size=64)
    # endpoints' test losses and vanilla's path on the HF models; weight's path on the canonical ones (its
    # ends as they are, the points between merged as circuits); per method the aligned end's and B's logits
    # on the first batch
    forward = (2 + LAMBDAS) * tokens * hf_flops + (2 * canonical_flops + (LAMBDAS - 2) * inside_flops) * tokens
    forward += 3 * first * hf_flops + first * canonical_flops
    forward_s = forward / rate[torch.float32]
    matching_s = sum(f / rate.get(dt, rate[torch.float32]) for dt, f in products.items())
    floor = forward_s + matching_s + solver_s
    at, base, (peak_at, peak, peak_file) = baseline_and_peak(watched, MARKER)
    two = sum(model_bytes(p) for p in paths)
    gap, after = longest_gap(watched, at)
    print(
        f"rates on the run's {threads} torch thread(s), the faster of two measurements: "
        f"float32 {rate[torch.float32] / 1e9:.1f} GFLOP/s, float64 {rate[torch.float64] / 1e9:.1f} GFLOP/s"
    )
    print(
        f"forwards: {2 + 2 * LAMBDAS} passes over {tokens} tokens and 4 over {first}: "
        f"{hf_flops / 1e6:.1f} MFLOP per token (Hugging Face), {canonical_flops / 1e6:.1f} (canonical), "
        f"{inside_flops / 1e6:.1f} (inside weight's path: qk, vo as circuits); "
        f"{forward / 1e12:.2f} TFLOP = {forward_s:.1f} s at the rate"
    )
    flops = ", ".join(f"{str(dt).removeprefix('torch.')} {f / 1e9:.1f} GFLOP" for dt, f in products.items())
    print(
        f"weight matching: {iterations} iterations, {rows} vocabulary rows; products {flops} = {matching_s:.1f} s "
        f"at the rates; assignments {solver_s:.1f} s; the run's matching took {pair['seconds']:.1f} s"
    )
    print(f"two models: {scale.gib(two)} (float32); the run's baseline {scale.gib(base)} at {at:.1f} s")
    print(
        f"peak {scale.gib(peak)} at {peak_at:.1f} s ({scale.gib(peak_file)} of it file-backed: the folders' mapped "
        f"weights), after the line {line_before(watched, peak_at)[-90:]!r}"
    )
    print()
    print(f"{'':<22}{'measured':>12}{'bound':>12}{'ratio':>8}")
    print(f"{'seconds / floor':<22}{seconds:>12.1f}{floor:>12.1f}{seconds / floor:>7.2f}x   (bound 2x)")
    above = peak - base
    print(f"{'peak memory / models':<22}{scale.gib(above):>12}{scale.gib(two):>12}{above / two:>7.2f}x   (bound 1.5x)")
    print(f"{'longest gap (s)':<22}{gap:>12.1f}{30.0:>12.1f}{gap / 30:>7.2f}x   (bound 1x; after: {after[:60]!r})")


if __name__ == "__main__":
    main()
