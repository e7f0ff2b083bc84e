"""Wall time of training K seeds' endpoints one after another and side by side (train.parallel_endpoints),
or with --ensemble as one batched model (train.ensemble), beside one seed alone, measured in one run on one
machine.

  .venv/bin/python benchmarks/parallel_seeds.py [--seeds K] [--parallel N] [--ensemble] [--device cpu|cuda] [--full]
      [hydra overrides]

Each time is the endpoint stage as run.py runs it (glmc.pipeline.endpoints.get_endpoints: train, cache,
load and convert every seed, with the run's test evaluator) on an empty endpoint cache of its own, so the
side-by-side time includes starting the worker processes. Printed: the three times, "K seeds side by side
/ one seed" (the target on one GPU: ten seeds at most 3x one seed) and "sequential / side by side"; with
--ensemble, "ensemble / one seed" and "sequential / ensemble" (and with --parallel N too, the seeds side by side,
N at once, timed in the same run).

Defaults by device:
  cpu   K=4, the default digits ViT (width 256) on a slice of the data (CPU_OVERRIDES); this process's torch
        threads are shared out among the workers (threads // N each). --full: the default run's whole
        training instead (run.py with no experiment: all of digits' training images, 40 epochs)
  cuda  K=10, paper 001's Tiny Shakespeare GPT-2 at the paper's size (experiment=shakespeare_gpt2: 6 layers,
        width 256, windows of 256 GPT-2 tokens, batch 32, float32) for one epoch of 100 batches
        (GPU_OVERRIDES); add where the corpus and the tokenizer are:
          .venv/bin/python benchmarks/parallel_seeds.py --device cuda data.root=/data data.tokenizer_path=/models/gpt2
Overrides given on the command line come after the defaults, so they win.
"""

from __future__ import annotations

import argparse
import copy
import logging
import tempfile
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from omegaconf import open_dict

from glmc.config import register_configs
from glmc.data.module import DataModule
from glmc.eval.evaluator import run_evaluators
from glmc.pipeline.endpoints import get_endpoints
from glmc.pipeline.tracking import Tracker
from glmc.pipeline.validate import validate_config
from glmc.train.trainer import quiet_lightning, resolve_device

ROOT = Path(__file__).resolve().parents[1]
CPU_OVERRIDES = ("debug=fast_full_size", "data.limit_train=512", "train.max_epochs=2", "logger=none")
FULL_OVERRIDES = ("logger=none", "trainer.enable_progress_bar=false")
GPU_OVERRIDES = (
    "experiment=shakespeare_gpt2",
    "train.max_epochs=1",
    "train.early_stopping_patience=null",
    "data.limit_train=3200",  # 100 batches of 32 windows
    "data.limit_test=640",
    "trainer.enable_progress_bar=false",
    "logger=none",
)


def compose_config(overrides: list[str]):
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def stage_seconds(cfg, seeds: list[int], parallel: int, folder: Path, ensemble: bool = False) -> float:
    """Wall time of the endpoint stage for `seeds`, `parallel` at a time (or as one batched model), on an
    empty cache in `folder`."""
    with open_dict(cfg):
        cfg.seeds = seeds
        cfg.pairing = "all"  # one seed is a valid run here: the stage alone is timed, never paired
        cfg.train.parallel_endpoints = parallel
        cfg.train.ensemble = ensemble
        cfg.cache_dir = str(folder / "endpoints")
    data = DataModule(cfg.data, seed=0)
    data.setup()
    test, _ = run_evaluators(cfg, data, resolve_device(cfg.trainer.accelerator))
    start = time.perf_counter()
    with Tracker(cfg, folder / "run") as tracker:
        endpoints = get_endpoints(cfg, folder / "run", tracker, test)
    seconds = time.perf_counter() - start
    assert len(endpoints) == len(seeds) and not any(e.cached for e in endpoints)
    return seconds


def machine(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def main(
    overrides: list[str],
    seeds: int | None,
    parallel: int | None,
    device: str,
    ensemble: bool = False,
    full: bool = False,
) -> dict[str, float]:
    quiet_lightning()
    k = seeds or (10 if device == "cuda" else 4)
    n = 1 if ensemble else parallel or k
    defaults = GPU_OVERRIDES if device == "cuda" else FULL_OVERRIDES if full else CPU_OVERRIDES
    cfg = compose_config([*defaults, *overrides])
    with open_dict(cfg):
        cfg.seeds = list(range(k))
        cfg.pairing = "all"
        cfg.train.parallel_endpoints = n
    validate_config(cfg)  # refusals (e.g. a missing corpus) before any timing
    beside = None
    with tempfile.TemporaryDirectory() as tmp:
        one = stage_seconds(copy.deepcopy(cfg), [0], 1, Path(tmp) / "one")
        sequential = stage_seconds(copy.deepcopy(cfg), list(range(k)), 1, Path(tmp) / "sequential")
        side = stage_seconds(copy.deepcopy(cfg), list(range(k)), n, Path(tmp) / "side_by_side", ensemble)
        if ensemble and parallel:  # the ensemble beside the same seeds side by side, in one run
            beside = stage_seconds(copy.deepcopy(cfg), list(range(k)), parallel, Path(tmp) / "beside")
    threads = torch.get_num_threads()
    print(f"{machine(device)}, {threads} torch threads in this process, {cfg.model.name} on {cfg.data.name}")
    print(f"one seed:                         {one:8.1f} s")
    print(f"{k} seeds one after another:       {sequential:8.1f} s")
    if ensemble:
        print(f"{k} seeds as one batched model:    {side:8.1f} s")
        print(f"ensemble / one seed {side / one:.2f}")
        print(f"sequential / ensemble {sequential / side:.2f}")
        times = {"one": one, "sequential": sequential, "ensemble": side}
        if beside is not None:
            print(f"{k} seeds side by side ({parallel} at once): {beside:8.1f} s")
            print(f"sequential / side by side {sequential / beside:.2f}")
            times["side_by_side"] = beside
        return times
    print(f"{k} seeds side by side ({n} at once): {side:8.1f} s")
    print(f"{k} seeds side by side / one seed:  {side / one:8.2f}x")
    print(f"sequential / side by side:        {sequential / side:8.2f}x")
    return {"one": one, "sequential": sequential, "side_by_side": side}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=None, help="K (default: 4 on cpu, 10 on cuda)")
    parser.add_argument("--parallel", type=int, default=None, help="endpoints at once (default: K)")
    parser.add_argument("--ensemble", action="store_true", help="the K seeds as one batched model (train.ensemble)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--full", action="store_true", help="cpu: the default run's whole training, not a slice")
    args, rest = parser.parse_known_args()
    logging.basicConfig(level=logging.WARNING)
    main(rest, args.seeds, args.parallel, args.device, args.ensemble, args.full)
