"""Evaluator cost of an 11-point barrier path relative to 11 plain forward passes.

    .venv/bin/python benchmarks/evaluator_speed.py [--repeats 3] [--images 256] [--models demo,paper]

For each model size, in the same run and over the same test batches:
  plain     11 passes of the Hugging Face model's forward and loss, batches already in memory
  vanilla   Evaluator.path over the original models (torch.func.functional_call per lambda)
  factored  Evaluator.path over canonical models, heads interpolated as factored weights
  circuit   Evaluator.path over canonical models, QK and OV interpolated as circuits (stacked heads)
Each evaluator run starts from a fresh Evaluator given the DataLoader, so reading the batches
and building 11 parameter sets are inside its time. Prints medians and their ratios to plain
(the target for the factored paths is at most 1.2x). Weights are random: cost does not depend on them.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from transformers import ViTConfig, ViTForImageClassification

from glmc.alignment import Alignment
from glmc.eval.evaluator import Evaluator
from glmc.models import to_canonical

LAMBDAS = [i / 10 for i in range(11)]
SIZES = {  # name: (image, patch, channels, width, layers, heads, mlp, batch)
    "demo": (8, 2, 1, 64, 4, 4, 128, 256),  # conf/model/vit_digits.yaml
    "paper": (32, 4, 3, 256, 6, 8, 512, 128),  # conf/model/vit_cifar.yaml (paper 001 Table 3)
}


def vit(size: str, seed: int) -> ViTForImageClassification:
    image, patch, channels, width, layers, heads, mlp, _ = SIZES[size]
    torch.manual_seed(seed)
    return ViTForImageClassification(
        ViTConfig(
            image_size=image,
            patch_size=patch,
            num_channels=channels,
            hidden_size=width,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=mlp,
            num_labels=10,
            attn_implementation="eager",
        )
    ).eval()


def test_batches(size: str, images: int) -> DataLoader:
    image, _, channels, *_, batch = SIZES[size]
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(
        torch.randn(images, channels, image, image, generator=g), torch.randint(0, 10, (images,), generator=g)
    )
    return DataLoader(data, batch_size=batch)


def plain_passes(model: torch.nn.Module, batches: list) -> float:
    start = time.perf_counter()
    with torch.inference_mode():
        for _ in LAMBDAS:
            total = 0.0
            for x, y in batches:
                total += F.cross_entropy(model(x).logits, y, reduction="sum").item()
    return time.perf_counter() - start


def path_seconds(alignment: Alignment, loader: DataLoader) -> float:
    start = time.perf_counter()
    Evaluator(loader, progress=False).path(alignment, LAMBDAS)
    return time.perf_counter() - start


def measure(size: str, images: int, repeats: int) -> dict[str, float]:
    hf_a, hf_b = vit(size, 0), vit(size, 1)
    a, b = to_canonical(hf_a), to_canonical(hf_b)
    loader = test_batches(size, images)
    batches = list(loader)
    runs = {
        "plain": lambda: plain_passes(hf_a, batches),
        "vanilla": lambda: path_seconds(Alignment(hf_a, hf_b), loader),
        "factored": lambda: path_seconds(Alignment(a, b), loader),
        "circuit": lambda: path_seconds(Alignment(a, b, circuits=("qk", "vo")), loader),
    }
    runs["plain"]()  # warm-up: first-call allocations and kernel selection
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):  # interleaved, so drift in machine speed hits every variant alike
        for name, run in runs.items():
            times[name].append(run())
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--images", type=int, default=360, help="test images per size (digits test split: 360)")
    parser.add_argument("--models", default="demo,paper", help=f"comma-separated subset of {list(SIZES)}")
    args = parser.parse_args()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {len(LAMBDAS)}-point path, "
        f"{args.images} test images, median of {args.repeats}"
    )
    for size in args.models.split(","):
        if size not in SIZES:
            raise SystemExit(f"--models: {size!r} is not one of {list(SIZES)}")
        t = measure(size, args.images, args.repeats)
        image, patch, channels, width, layers, heads, mlp, batch = SIZES[size]
        print(
            f"\nViT {size}: {layers} layers, width {width}, {heads} heads, MLP {mlp}, "
            f"{(image // patch) ** 2 + 1} tokens, batch {batch}"
        )
        print(f"  11 plain forward passes        {t['plain']:8.3f} s")
        for name in ("vanilla", "factored", "circuit"):
            target = "  (target <= 1.2x)" if name != "circuit" else ""
            print(f"  {name:9s} path, 11 points      {t[name]:8.3f} s   {t[name] / t['plain']:5.2f}x{target}")


if __name__ == "__main__":
    main()
