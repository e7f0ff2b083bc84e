"""Scale on paper: weight matching seconds and peak memory on the CPU at GPT-2 124M and 1B-Llama size,
and what learned matching would need per GPU.

    .venv/bin/python benchmarks/scale.py [--shapes gpt2-124m llama-1b] [--iterations N] [--vocab-rows 30000]
        [--batches 8x1024 32x1024] [--threads N] [--stash auto|always|never] [--layers N] [--vocab N]

Shapes, built from their Hugging Face configs with random weights (seeds 0 and 1, float32):
  gpt2-124m  GPT-2 small: width 768, 12 layers of 12 heads, MLP 3072, vocabulary 50257, 1024 positions
  llama-1b   the shape of Llama 3.2 1B: width 2048, 16 layers of 32 query and 8 key/value heads of
             dimension 64, gated MLP 8192, vocabulary 128256, tied embeddings, rotary base 500000 (the
             default rotary type: glmc converts no scaled one)
Each pair is converted to canonical form (the Hugging Face models freed at once, and with --stash, by
default for models over 1 GiB, model A kept in a temporary file while B is converted, so that two 1B
models fit) and aligned by weight matching (glmc.matching.weight) for exactly --iterations iterations (the
tolerance is set so that none stops early; default 15 for GPT-2, the matcher's default, and 2 for
Llama, where an iteration solves 16 Hungarian problems of 8192 x 8192), with the embedding rows
restricted to --vocab-rows random token ids, as the pipeline restricts them to the ids its data use
(0: all). The cost of an iteration does not depend on the weights' values.

Reported per shape: parameters, the two canonical models' size, the matching's wall seconds, by step
and per iteration, and the process's peak resident memory (ru_maxrss) during the matching, absolute and
above the resident memory just before it (the peak is reset before matching through
/proc/self/clear_refs where the kernel allows it; elsewhere it includes building the models). Then
memory_estimate.py's estimate of one learned-matching step for each --batches setting (batch x
sequence, per GPU; the estimate takes the full shape, also where --layers or --vocab cut the matched
models), and which GPU sizes it fits: 24 GB (24564 MiB), 40 GB (40536 MiB), 80 GB (81559 MiB),
141 GB (143771 MiB), the totals such cards report, less 2 GiB for the CUDA context and the allocator's
slack; and the largest batch of each sequence length that fits each.

--layers N and --vocab N cut the matched models for quick checks (the output says so). The two full
models take 1.2 GiB (GPT-2) and 11.2 GiB (Llama) before the matching's own memory. The Llama shape cut
to 8 of its 16 layers peaked 6.8 GiB above its 7.5 GiB of models (docs/experiments.md, "What fits"), which puts the
full llama-1b at about 25 GiB: run it on a machine with 32 GiB or more.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import resource
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from memory_estimate import learned_matching_memory  # benchmarks/memory_estimate.py, beside this script
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from glmc.matching.weight import weight_matching
from glmc.models.canonical import CanonicalConfig, CanonicalTransformer
from glmc.models.families import family_of_hf

GIB = 2**30
# (label, MiB the card reports): usable is that less RESERVE
GPUS = (("24 GB", 24564), ("40 GB", 40536), ("80 GB", 81559), ("141 GB", 143771))
RESERVE = 2 * GIB
STASH_ABOVE = GIB  # --stash auto: models larger than this wait on disk while the other is built


@dataclass(frozen=True)
class Shape:
    name: str
    layers: int
    vocab: int
    iterations: int  # default weight-matching iterations

    def config(self, layers: int, vocab: int):
        if self.name == "gpt2-124m":
            eos = 50256 if vocab > 50256 else None  # GPT-2's end-of-text id, where the vocabulary has it
            return GPT2Config(
                n_embd=768,
                n_layer=layers,
                n_head=12,
                vocab_size=vocab,
                n_positions=1024,
                bos_token_id=eos,
                eos_token_id=eos,
            )
        if self.name == "llama-1.1b":
            return LlamaConfig(
                hidden_size=2048,
                num_hidden_layers=layers,
                num_attention_heads=32,
                num_key_value_heads=4,
                head_dim=64,
                intermediate_size=5632,
                vocab_size=vocab,
                max_position_embeddings=2048,
                tie_word_embeddings=False,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            )
        return LlamaConfig(
            hidden_size=2048,
            num_hidden_layers=layers,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=64,
            intermediate_size=8192,
            vocab_size=vocab,
            max_position_embeddings=131072,
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        )

    def hf_class(self):
        return GPT2LMHeadModel if self.name == "gpt2-124m" else LlamaForCausalLM


SHAPES = {
    s.name: s
    for s in (Shape("gpt2-124m", 12, 50257, 15), Shape("llama-1b", 16, 128256, 2), Shape("llama-1.1b", 22, 32000, 2))
}


def machine() -> str:
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    memory = ""
    try:
        with open("/proc/meminfo") as f:
            total = next(int(line.split()[1]) for line in f if line.startswith("MemTotal"))
        memory = f", {total * 1024 / GIB:.1f} GiB memory"
    except (OSError, StopIteration):
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (
        f"{cpu}, {os.cpu_count()} cores ({usable} usable){memory}; torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads"
    )


def rss() -> int:
    """Resident memory of this process now, bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss() -> int:
    """The process's peak resident memory, bytes (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak() -> bool:
    """Set the peak resident memory to the current one (Linux >= 4.0); False where that is refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def trim() -> None:
    """Collect garbage and hand the C heap's free pages back to the system (glibc), so that the
    resident memory before matching holds the models, not what building them left free."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def canonical(hf) -> CanonicalTransformer:
    # the family's converter, not glmc.to_canonical: that keeps the Hugging Face model as .source
    return family_of_hf(hf).to_canonical(hf)


def build(shape: Shape, seed: int, layers: int, vocab: int) -> tuple[CanonicalTransformer, int]:
    """A canonical model with random weights, and its Hugging Face parameter count (tied counted once)."""
    torch.manual_seed(seed)
    hf = shape.hf_class()(shape.config(layers, vocab)).float()
    count = sum(p.numel() for p in hf.parameters())
    model = canonical(hf)
    del hf
    trim()
    return model, count


def build_pair(shape: Shape, layers: int, vocab: int, stash: bool) -> tuple[CanonicalTransformer, ...]:
    """Models of seeds 0 and 1, and the Hugging Face parameter count. With `stash`, model A waits in a
    temporary file while B is built: converting a model holds the Hugging Face model, the converted
    tensors and their copy in the canonical module at once, which for a 1B model is about 16 GiB on
    top of A's 6 GiB."""
    a, count = build(shape, 0, layers, vocab)
    if not stash:
        return a, build(shape, 1, layers, vocab)[0], count
    with tempfile.TemporaryDirectory(prefix="glmc_scale_") as folder:
        path = Path(folder) / "a.pt"
        torch.save({"config": a.config.to_dict(), "params": a.state_dict()}, path)
        del a
        trim()
        b, _ = build(shape, 1, layers, vocab)
        saved = torch.load(path, mmap=True, weights_only=True)
        a = CanonicalTransformer(CanonicalConfig.from_dict(saved["config"]), saved["params"])
        del saved
    trim()
    return a, b, count


def full_shape(shape: Shape) -> CanonicalTransformer:
    """The uncut shape on the meta device: shapes only, no memory."""
    with torch.device("meta"):
        hf = shape.hf_class()(shape.config(shape.layers, shape.vocab))
    return canonical(hf)


def full_params(shape: Shape, layers: int, vocab: int) -> int:
    """Canonical parameters of the (possibly cut) shape, from the meta device."""
    with torch.device("meta"):
        hf = shape.hf_class()(shape.config(layers, vocab))
    return sum(t.numel() for t in canonical(hf).parameters())


def size(model: CanonicalTransformer) -> int:
    return sum(t.numel() * t.element_size() for t in model.parameters())


def gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def match(shape: Shape, layers: int, vocab: int, iterations: int, vocab_rows: int, stash: str, layerwise: str) -> None:
    cut = []
    if layers != shape.layers:
        cut.append(f"{layers} of {shape.layers} layers")
    if vocab != shape.vocab:
        cut.append(f"vocabulary {vocab} of {shape.vocab}")
    print(f"\n== {shape.name}" + (f" -- CUT to {', '.join(cut)}: not the full shape" if cut else ""))
    tick = time.perf_counter()
    # float32 canonical tensors: 4 bytes per parameter, biases included
    stashed = stash == "always" or (stash == "auto" and 4 * full_params(shape, layers, vocab) > STASH_ABOVE)
    a, b, hf_count = build_pair(shape, layers, vocab, stashed)
    built_s = time.perf_counter() - tick
    params = sum(t.numel() for t in a.parameters())
    print(
        f"parameters: {hf_count:,} (Hugging Face), {params:,} canonical (head untied, zero biases where the "
        f"source has none); two models {gib(2 * size(a))}; built in {built_s:.1f} s"
        f"{' (A stashed on disk while B was built)' if stashed else ''}, peak RSS so far {gib(peak_rss())}"
    )
    rows = vocab if vocab_rows <= 0 or vocab_rows >= vocab else vocab_rows
    tokens = None
    if rows < vocab:
        tokens = torch.randperm(vocab, generator=torch.Generator().manual_seed(0))[:rows].sort().values
    gc.collect()
    was_reset = reset_peak()
    before = rss()
    tick = time.perf_counter()
    layered = {"auto": None, "always": True, "never": False}[layerwise]
    _, diag = weight_matching(
        a, b, "orthogonal", max_iter=iterations, tol=-float("inf"), tokens=tokens, layerwise=layered
    )
    wall = time.perf_counter() - tick
    peak = peak_rss()
    ran = diag["iterations"]
    print(
        f"weight matching, {ran} iteration(s), {rows} of {vocab} vocabulary rows: {wall:.2f} s "
        f"(relative distance {diag['objective'][0]:.4f} -> {diag['final_distance']:.4f})"
    )
    steps = diag["seconds_by_step"]
    other = wall - sum(steps.values())
    print(f"  {'step':<12}{'seconds':>10}{'per iteration':>16}")
    for step, seconds in steps.items():
        per = "(once)" if step == "in_head" else f"{seconds / max(ran, 1):.3f}"
        print(f"  {step:<12}{seconds:>10.3f}{per:>16}")
    print(f"  {'other':<12}{other:>10.3f}{'(setup, once)':>16}")
    looped = sum(seconds for step, seconds in steps.items() if step != "in_head")
    print(f"  {'total':<12}{wall:>10.3f}{looped / max(ran, 1):>16.3f}")
    where = "during matching" if was_reset else "of the process (not reset: includes building the models)"
    print(f"peak RSS {where}: {gib(peak)}, {gib(peak - before)} above the {gib(before)} before matching")
    del a, b
    trim()


def largest_batch(model: CanonicalTransformer, seq: int, capacity: int) -> int:
    """The largest batch of `seq` tokens whose estimate fits `capacity` bytes (0 if none)."""
    fits = lambda n: learned_matching_memory(model, n, seq)["total"] <= capacity  # noqa: E731
    if not fits(1):
        return 0
    low, high = 1, 2
    while fits(high):
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def estimate(shape: Shape, batches: list[tuple[int, int]]) -> None:
    model = full_shape(shape)
    usable = [(label, mib * 2**20 - RESERVE) for label, mib in GPUS]
    print(f"learned matching, one step per GPU (memory_estimate.py; full {shape.name} shape, float32):")
    rows = [learned_matching_memory(model, batch, seq) for batch, seq in batches]
    header = "".join(f"{f'{b}x{s}':>12}" for b, s in batches)
    print(f"  {'part (GiB)':<16}{header}")
    for part in rows[0]:
        if part == "total":
            continue
        print(f"  {part:<16}" + "".join(f"{r[part] / GIB:>12.2f}" for r in rows))
    print(f"  {'total':<16}" + "".join(f"{r['total'] / GIB:>12.2f}" for r in rows))
    for (batch, seq), r in zip(batches, rows):
        fits = [label for label, cap in usable if r["total"] <= cap]
        print(f"  {batch}x{seq}: fits {', '.join(fits) if fits else 'none of ' + ', '.join(g for g, _ in GPUS)}")
    for seq in sorted({s for _, s in batches}):
        best = ", ".join(f"{label} {largest_batch(model, seq, cap)}" for label, cap in usable)
        print(f"  largest batch of {seq} tokens per GPU: {best}")


def batch_setting(text: str) -> tuple[int, int]:
    batch, _, seq = text.lower().partition("x")
    try:
        return int(batch), int(seq)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not BATCHxSEQ, e.g. 8x1024") from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--iterations", type=int, help="weight-matching iterations (default: per shape)")
    parser.add_argument("--vocab-rows", type=int, default=30000, help="token ids kept by the restriction (0: all)")
    parser.add_argument("--batches", nargs="+", type=batch_setting, default=[(8, 1024), (32, 1024)])
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    parser.add_argument("--layers", type=int, help="cut the matched models to this many layers (quick checks)")
    parser.add_argument("--vocab", type=int, help="cut the matched models' vocabulary (quick checks)")
    parser.add_argument(
        "--stash",
        choices=("auto", "always", "never"),
        default="auto",
        help="keep model A in a temporary file while B is built (auto: models over 1 GiB)",
    )
    parser.add_argument(
        "--layerwise",
        choices=("auto", "always", "never"),
        default="auto",
        help="B's transformed weights one layer at a time (auto: from 1 GiB of layer weights)",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(machine())
    for name in args.shapes:
        shape = SHAPES[name]
        iterations = args.iterations or shape.iterations
        layers, vocab = args.layers or shape.layers, args.vocab or shape.vocab
        match(shape, layers, vocab, iterations, args.vocab_rows, args.stash, args.layerwise)
        estimate(shape, args.batches)


if __name__ == "__main__":
    main()
