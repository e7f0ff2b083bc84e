"""Tokens per second of endpoint training on text: the DataLoader path against batches sliced on the device.

  .venv/bin/python benchmarks/endpoint_throughput.py [--steps 30] [--warmup 5] [--repeats 3] [hydra overrides]

Both paths train the same EndpointModule (same seed, same batches in the same order) with a Trainer of
the composed trainer group (trainer=cpu by default; add trainer=gpu on a GPU, whose trainer.precision=auto
then trains in bf16-mixed where the card has it):

  loader  the earlier path: a DataLoader fetches and collates every batch on the host (and copies it to
          the device), the default AdamW, the divergence check reads the loss after every step
  sliced  the token windows copied to the device once and every batch sliced there
          (glmc.data.device_batches), fused AdamW where the parameters are on CUDA, the loss read every
          DivergenceGuard.DEVICE_EVERY steps

Each fit times its steps after the first --warmup (the device synchronised at both ends); fits alternate
between the paths, so that drifts in the machine's load hit both alike, and the medians of tokens per
second and their ratio are printed, then the data path alone: an epoch of training batches brought to the
device, per batch.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import lightning as L
import torch
from hydra import compose, initialize_config_dir
from lightning.pytorch.callbacks import Callback

from glmc.config import register_configs
from glmc.data.module import DataModule
from glmc.models.build import build_model
from glmc.train.divergence import DivergenceGuard
from glmc.train.endpoint import EndpointModule
from glmc.train.trainer import quiet_lightning, trained_precision, trainer_factory

ROOT = Path(__file__).resolve().parents[1]
PATHS = ("loader", "sliced")


def synchronize() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class StepClock(Callback):
    """Seconds from the start of step `warmup` to the end of training, and the steps in between: on the
    wall clock and in this process's CPU time (all its threads), which a shared machine's load disturbs less."""

    def __init__(self, warmup: int):
        self.warmup, self.steps = warmup, 0
        self.start = self.cpu_start = self.seconds = self.cpu_seconds = 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.warmup and not self.start:
            synchronize()
            self.start, self.cpu_start = time.perf_counter(), time.process_time()

    def on_train_end(self, trainer, pl_module) -> None:
        synchronize()
        self.seconds, self.cpu_seconds = time.perf_counter() - self.start, time.process_time() - self.cpu_start
        self.steps = trainer.global_step - self.warmup


def tokens_per_second(cfg, path: str, steps: int, warmup: int) -> tuple[float, float, str]:
    """One fit on `path` (loader or sliced): its tokens per second of wall-clock and of CPU time, and the
    device it trained on."""
    L.seed_everything(0, verbose=False)
    module = EndpointModule(build_model(cfg.model), cfg.train, cfg.data.task)
    data = DataModule(cfg.data, seed=0)
    sliced = path == "sliced"
    data.device_batches = sliced
    module.fused_adamw = None if sliced else False  # None: fused where the parameters are on CUDA
    guard = DivergenceGuard(f"benchmark ({path})", "")
    guard.DEVICE_EVERY = DivergenceGuard.DEVICE_EVERY if sliced else 1
    clock = StepClock(warmup)
    trainer = trainer_factory(cfg.trainer)(
        max_steps=warmup + steps,
        max_epochs=-1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        callbacks=[guard, clock],
        limit_val_batches=0,
        gradient_clip_val=cfg.train.gradient_clip_val,
    )
    trainer.fit(module, datamodule=data)
    tokens = clock.steps * cfg.data.batch_size * cfg.data.seq_len
    return tokens / clock.seconds, tokens / clock.cpu_seconds, str(trainer.strategy.root_device)


def seconds_per_batch(cfg, path: str, device: str, repeats: int = 5) -> float:
    """The data path alone: one epoch of training batches, each on `device` (the loader's batches copied
    there as Lightning copies them), median seconds per batch."""
    data = DataModule(cfg.data, seed=0)
    data.setup()
    data.device_batches = path == "sliced"
    times = []
    for _ in range(repeats):
        loader = data.train_dataloader()
        if path == "sliced":  # without a trainer the windows stay on the CPU: put them where training ran
            loader.windows = loader.windows.to(device)
        synchronize()
        tick = time.perf_counter()
        for inputs, targets in loader:
            inputs, targets = inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
        synchronize()
        times.append((time.perf_counter() - tick) / len(loader))
    return statistics.median(times)


def where(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()}, {torch.get_num_threads()} threads"
    return f"CPU, {torch.get_num_threads()} threads"


def main(overrides: list[str], steps: int, warmup: int, repeats: int, threads: int | None = None) -> None:
    quiet_lightning()
    if threads:
        torch.set_num_threads(threads)
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["experiment=demo_text", *overrides])
    rates: dict[str, list[float]] = {path: [] for path in PATHS}
    cpu_rates: dict[str, list[float]] = {path: [] for path in PATHS}
    device = "cpu"
    for repeat in range(repeats):
        for path in PATHS if repeat % 2 == 0 else PATHS[::-1]:  # neither path always first
            rate, cpu_rate, device = tokens_per_second(cfg, path, steps, warmup)
            rates[path].append(rate)
            cpu_rates[path].append(cpu_rate)
    med = {path: statistics.median(values) for path, values in rates.items()}
    cpu_med = {path: statistics.median(values) for path, values in cpu_rates.items()}
    batch = {path: seconds_per_batch(cfg, path, device) for path in PATHS}
    print(
        f"{cfg.experiment}: {cfg.model.family} of width {cfg.model.hidden_size}, {cfg.model.num_layers} layers, "
        f"batch {cfg.data.batch_size} x {cfg.data.seq_len} tokens, {trained_precision(cfg.trainer)}, "
        f"on {where(device)}; median of {repeats} fits x {steps} steps after {warmup}"
    )
    for path in PATHS:
        print(f"  {path:<7} {med[path]:12,.0f} tokens/s   ({', '.join(f'{r:,.0f}' for r in rates[path])})")
    print(f"  ratio sliced / loader {med['sliced'] / med['loader']:.2f}x")
    if device == "cpu":  # on a GPU the process's CPU time says little about the steps
        print(
            f"  per second of CPU time: loader {cpu_med['loader']:,.0f}, sliced {cpu_med['sliced']:,.0f} tokens"
            f" (ratio {cpu_med['sliced'] / cpu_med['loader']:.2f}x)"
        )
    loader_us, sliced_us = 1e6 * batch["loader"], 1e6 * batch["sliced"]
    print(
        f"  the data path alone, per batch: loader {loader_us:,.0f} us, sliced {sliced_us:,.0f} us"
        f" ({loader_us / sliced_us:.1f}x less)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="timed steps per fit")
    parser.add_argument("--warmup", type=int, default=5, help="steps per fit before timing")
    parser.add_argument("--repeats", type=int, default=3, help="fits per path")
    parser.add_argument("--threads", type=int, default=None, help="torch's CPU threads (default: all cores)")
    known, overrides = parser.parse_known_args()
    main(overrides, known.steps, known.warmup, known.repeats, known.threads)
