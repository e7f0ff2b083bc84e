"""Barriers of one pair of endpoints trained in float32 and in bf16-mixed (trainer.precision), the same
config otherwise: what mixed-precision training does to the science.

  .venv/bin/python benchmarks/precision_barriers.py [--precisions 32-true bf16-mixed] [--threads N] [overrides]

By default experiment=demo_text (two-layer character GPT-2s of width 128, 2 epochs on the embedded
corpus) on its first 1,600 training windows, seeds 0 and 1, methods vanilla, weight and learned (50
steps), endpoints trained afresh in a temporary cache for every precision. Alignment and the barriers
are float32 in every run (eval.precision=full): only the training differs. Prints each run's endpoint
test losses, barriers and seconds, then each method's barrier difference from the first precision's.
Overrides go to every run (e.g. matcher.methods=[vanilla,weight] to leave learned matching out,
trainer=gpu on a GPU).
"""

from __future__ import annotations

import argparse
import logging
import platform
import tempfile
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from glmc.config import register_configs
from glmc.pipeline.run import run_pipeline

ROOT = Path(__file__).resolve().parents[1]
# demo_text cut to about half its training windows (1,600 of 3,270: 200 steps per endpoint) and half its
# learned steps, so that both runs take a few minutes on two cores
DEFAULTS = (
    "experiment=demo_text",
    "seeds=[0,1]",
    "data.limit_train=1600",
    "matcher.methods=[vanilla,weight,learned]",
    "matcher.learned.max_steps=50",
    "trainer.enable_progress_bar=false",
    "logger=none",
)


def machine() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()}, {torch.get_num_threads()} threads"
    return platform.processor() or platform.machine()


def run(precision: str, overrides: list[str], folder: Path) -> tuple[dict, float]:
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(
            config_name="config",
            overrides=[*DEFAULTS, f"cache_dir={folder / 'endpoints'}", *overrides, f"trainer.precision={precision}"],
        )
    tick = time.perf_counter()
    results = run_pipeline(cfg, folder / f"run_{precision}")
    return results, time.perf_counter() - tick


def main(precisions: list[str], overrides: list[str], threads: int | None = None) -> None:
    if threads:
        torch.set_num_threads(threads)
    logging.getLogger().setLevel(logging.WARNING)  # the runs' own tables are printed; their logs are not needed
    register_configs()
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for precision in precisions:
            runs[precision] = run(precision, overrides, Path(tmp) / precision)
    first = precisions[0]
    methods = list(runs[first][0]["methods"])
    print(f"\n{runs[first][0]['experiment']}, {machine()}; barriers evaluated in {runs[first][0]['eval_dtype']}")
    print(f"{'precision':<12}{'seconds':>9}  {'endpoint test losses':<22}" + "".join(f"{m:>10}" for m in methods))
    for results, seconds in runs.values():
        losses = " ".join(f"{e['test_loss']:.4f}" for e in results["endpoints"])
        barriers = "".join(f"{results['methods'][m]['barrier']:10.4f}" for m in methods)
        print(f"{results['train_precision']:<12}{seconds:9.1f}  {losses:<22}{barriers}")
    for precision in precisions[1:]:
        diff = "".join(
            f"{runs[precision][0]['methods'][m]['barrier'] - runs[first][0]['methods'][m]['barrier']:+10.4f}"
            for m in methods
        )
        print(f"{precision + ' - ' + first:<45}{diff}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precisions", nargs="+", default=["32-true", "bf16-mixed"], help="trainer.precision values")
    parser.add_argument("--threads", type=int, default=None, help="torch's CPU threads (default: all cores)")
    known, overrides = parser.parse_known_args()
    main(known.precisions, overrides, known.threads)
