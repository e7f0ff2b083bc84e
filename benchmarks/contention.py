"""Speed beside another busy process: steps per second alone and beside one busy single-thread process
(a spawned `while True: pass`), for endpoint training, learned matching and the learned refinement.

    .venv/bin/python benchmarks/contention.py [--seconds 4] [hydra overrides; default experiment=digits_universe]

The steps are the stages' own (as benchmarks/learned_step_cost.py builds them, on the digits ViTs of
experiment=digits_universe: cached endpoints where there are any, else fresh initialisations):
  endpoint training   forward, backward, gradient clipping and AdamW on a Hugging Face endpoint
  learned matching    LearnedMatchingModule.drawn_loss at the setting's lambda draws, backward, AdamW
  learned refinement  UniverseLearningModule's step (the worst of multi.candidates draws), backward, AdamW
Each is timed for --seconds under two thread policies: torch's default (every core) and threads=auto
(glmc.threads, chosen at the stage's start as a run chooses it, so beside the busy process it samples the
busy core). Printed: steps per second alone and contended, and their ratio (the target: at least 0.4 on
two cores). On a machine others are using, "alone" is not alone: the load average is printed beside.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import os
import time
from dataclasses import fields
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from glmc import threads
from glmc.config import register_configs
from glmc.data.module import DataModule
from glmc.matching.learned_module import LearnedMatchingModule, sample_lambda
from glmc.matching.registry import build_matcher, method_config
from glmc.matching.universe_learned import UniverseLearnedSettings, UniverseLearningModule
from glmc.metrics import logits_of
from glmc.models.build import build_model
from glmc.models.convert import to_canonical
from glmc.settings.groups import UniverseTraining
from glmc.symmetry import SymmetrySpec
from glmc.train.endpoint import training_loss

ROOT = Path(__file__).resolve().parents[1]


def spin() -> None:
    while True:
        pass


def steps_per_second(step, seconds: float) -> float:
    step()  # warm-up
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step()
        count += 1
    return count / (time.perf_counter() - start)


def build_steps(cfg) -> dict[str, tuple[object, int]]:
    """Per stage (its step, the elements its step touches: its parameters)."""
    models = []
    for seed in list(cfg.seeds)[:3]:
        torch.manual_seed(seed)
        models.append(build_model(cfg.model).eval())
    data = DataModule(cfg.data, seed=0)
    data.setup()
    order = itertools.cycle([b for _, b in zip(range(32), data.train_dataloader())])

    plain = build_model(cfg.model).train()
    plain_opt = torch.optim.AdamW(plain.parameters(), lr=cfg.train.lr)

    def endpoint_step():
        plain_opt.zero_grad(set_to_none=True)
        inputs, targets = next(order)
        training_loss(logits_of(plain, inputs), targets, cfg.data.task, cfg.train.label_smoothing).backward()
        torch.nn.utils.clip_grad_norm_(plain.parameters(), cfg.train.gradient_clip_val)
        plain_opt.step()

    canon = [to_canonical(m) for m in models]
    spec = SymmetrySpec.from_model(canon[0])
    kinds = {
        s.name: "orthogonal" if s.kind == "residual" else "permutation"
        for s in spec
        if s.kind in ("residual", "heads", "mlp")
    }
    settings = build_matcher(method_config(cfg, "learned")).settings
    identity = {n: torch.eye(spec.spaces[n].size) for n in kinds}
    pair = LearnedMatchingModule(canon[0], canon[1], identity, kinds, settings, cfg.data.task, ("qk", "vo"))
    pair_opt = torch.optim.AdamW(pair.latents.parameters(), lr=settings.lr)
    draws = torch.Generator().manual_seed(0)

    def learned_step():
        pair_opt.zero_grad(set_to_none=True)
        candidates = [sample_lambda(settings.lambda_scheme, draws) for _ in range(settings.lambda_candidates)]
        pair.drawn_loss(*next(order), candidates)[0].backward()
        pair_opt.step()

    multi = {f.name: cfg.multi[f.name] for f in fields(UniverseTraining) if f.name in cfg.multi}
    universe = UniverseLearningModule(
        canon, [kinds] * (len(canon) - 1), UniverseLearnedSettings(**multi), cfg.data.task
    )
    universe.log = lambda *args, **kwargs: None  # no Trainer to log to
    universe_opt = torch.optim.AdamW(universe.latents.parameters(), lr=universe.settings.lr)

    def refinement_step():
        universe_opt.zero_grad(set_to_none=True)
        universe.training_step(next(order), 0).backward()
        universe_opt.step()

    size = lambda module: sum(p.numel() for p in module.parameters())  # noqa: E731
    return {
        "endpoint training": (endpoint_step, size(plain)),
        "learned matching": (learned_step, size(pair)),
        "learned refinement": (refinement_step, size(universe)),
    }


def measure(step, work: int, policy: str, seconds: float) -> float:
    """Steps per second under a thread policy, the count chosen now (as at a stage's start)."""
    if policy == "auto":
        threads.adapt(work, "benchmark")
    else:
        torch.set_num_threads(threads._POLICY.original or torch.get_num_threads())
    return steps_per_second(step, seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="timed seconds per stage, policy and condition")
    known, overrides = parser.parse_known_args()
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["experiment=digits_universe", *overrides])
    steps = build_steps(cfg)
    threads.configure("auto")
    threads.RESAMPLE_AFTER = -1.0  # every stage start samples afresh
    cores = len(threads.usable_cores())
    print(f"{cores} usable cores, torch default {threads._POLICY.original} threads; load average {os.getloadavg()}")
    results = {}
    for policy in ("default", "auto"):
        for name, (step, work) in steps.items():
            alone = measure(step, work, policy, known.seconds)
            alone_threads = torch.get_num_threads()
            busy = multiprocessing.get_context("spawn").Process(target=spin, daemon=True)
            busy.start()
            time.sleep(0.5)  # the spinner running before the stage starts
            try:
                contended = measure(step, work, policy, known.seconds)
                contended_threads = torch.get_num_threads()
            finally:
                busy.terminate()
                busy.join()
            results[policy, name] = (alone, contended, alone_threads, contended_threads)
    print(f"{'stage':<20}{'threads':<9}{'alone':>9}{'beside':>9}{'ratio':>8}   threads alone/beside")
    for (policy, name), (alone, contended, t1, t2) in results.items():
        print(f"{name:<20}{policy:<9}{alone:>9.2f}{contended:>9.2f}{contended / alone:>8.2f}   {t1}/{t2}")
    print(f"(steps per second; load average at the end {os.getloadavg()})")


if __name__ == "__main__":
    main()
