"""What K training steps of the default digits ViT cost on this CPU in four layouts of the same kernels,
measured in one run: how far any way of training many seeds on the CPU can get below one seed after another.

  .venv/bin/python benchmarks/ensemble_layouts.py [--members K] [--processes P] [--repeats R] [hydra overrides]

  sequential          K plain steps (forward, backward, fused AdamW), one after another, all torch threads
  ensemble            one step of the K members stacked, as train.ensemble takes it (glmc.train.ensemble's
                      vmapped forward, its losses, fused AdamW over the stacked tensors, heap blocks)
  processes x plain   P processes side by side (threads // P each), each K / P plain steps
  processes x stacked P processes side by side, each one stacked step of its K / P members

Each figure is the median wall time of R repetitions after warm-up, in ms per K member-steps; the process
layouts are the slowest process's median. Printed: each layout's time and "sequential / layout". These
are the steps alone: a run adds Lightning's loop, validation and checkpoints around them
(benchmarks/parallel_seeds.py times whole runs). Subnormals are flushed, as in training.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from glmc.config import register_configs
from glmc.host_memory import large_blocks_from_heap
from glmc.metrics import logits_of
from glmc.models.build import build_model
from glmc.train.denormals import flush_denormals_everywhere
from glmc.train.endpoint import training_loss
from glmc.train.ensemble import EnsembleModule

ROOT = Path(__file__).resolve().parents[1]


def compose_config(overrides: list[str]):
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def batches(cfg, members: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One random batch per member, in the shape of the data's training batches."""
    generator = torch.Generator().manual_seed(seed)
    m = cfg.model
    size = (members, cfg.data.batch_size, m.num_channels, m.image_size, m.image_size)
    return torch.randn(size, generator=generator), torch.randint(0, m.num_labels, size[:2], generator=generator)


def plain_steps(cfg, members: int, seed: int):
    """(a function taking one plain step of each of `members` models, one after another; the models)."""
    torch.manual_seed(seed)
    models = [build_model(cfg.model).train() for _ in range(members)]
    optimizers = [torch.optim.AdamW(m.parameters(), lr=cfg.train.lr, fused=True) for m in models]
    inputs, targets = batches(cfg, members, seed)

    def step():
        for k, (model, optimizer) in enumerate(zip(models, optimizers)):
            training_loss(logits_of(model, inputs[k]), targets[k], cfg.data.task).backward()
            optimizer.step()
            optimizer.zero_grad()

    return step, models


def stacked_step(cfg, members: int, seed: int):
    """(a function taking one step of the same `members` models stacked as train.ensemble stacks them; its
    EnsembleModule)."""
    torch.manual_seed(seed)
    models = [build_model(cfg.model) for _ in range(members)]
    with torch.device("meta"):
        base = build_model(cfg.model)
    module = EnsembleModule(models, base, cfg.train, cfg.data.task).train()
    optimizer = torch.optim.AdamW(module.stacked, lr=cfg.train.lr, fused=True)
    inputs, targets = batches(cfg, members, seed)
    loss = torch.vmap(lambda logits, t: training_loss(logits, t, cfg.data.task))

    def step():
        loss(module(inputs), targets).sum().backward()
        optimizer.step()
        optimizer.zero_grad()

    return step, module


LAYOUTS = {"plain": plain_steps, "stacked": stacked_step}


def median_ms(step, repeats: int, warmup: int = 3) -> float:
    flush_denormals_everywhere(True)
    with large_blocks_from_heap():
        for _ in range(warmup):
            step()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def _in_process(overrides: list[str], layout: str, members: int, seed: int, threads: int, repeats: int, out) -> None:
    torch.set_num_threads(threads)
    cfg = compose_config(overrides)
    out.put(median_ms(LAYOUTS[layout](cfg, members, seed)[0], repeats))


def side_by_side_ms(overrides: list[str], layout: str, members: int, processes: int, repeats: int) -> float:
    """The slowest of `processes` processes, each timing `layout` over its share of the members at once."""
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    threads = max(1, torch.get_num_threads() // processes)
    share = members // processes
    args = [(overrides, layout, share, 1000 + p, threads, repeats, out) for p in range(processes)]
    workers = [context.Process(target=_in_process, args=a) for a in args]
    for w in workers:
        w.start()
    times = [out.get() for _ in workers]
    for w in workers:
        w.join()
    return max(times)


def main(overrides: list[str], members: int, processes: int, repeats: int) -> dict[str, float]:
    if members % processes:
        raise SystemExit(f"--members {members} does not split evenly over --processes {processes}")
    cfg = compose_config(overrides)
    times = {
        "sequential": median_ms(plain_steps(cfg, members, 0)[0], repeats),
        "ensemble": median_ms(stacked_step(cfg, members, 0)[0], repeats),
        f"{processes} processes x plain": side_by_side_ms(overrides, "plain", members, processes, repeats),
        f"{processes} processes x stacked": side_by_side_ms(overrides, "stacked", members, processes, repeats),
    }
    threads = torch.get_num_threads()
    print(f"{threads} torch threads, {cfg.model.name}, {members} members: ms per {members} member-steps")
    for name, ms in times.items():
        print(f"{name:28s} {ms:8.1f} ms   sequential / layout {times['sequential'] / ms:.2f}")
    return times


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", type=int, default=8)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=15)
    args, rest = parser.parse_known_args()
    main(rest, args.members, args.processes, args.repeats)
