"""train.parallel_endpoints=N > 1: the endpoints not cached yet train side by side, up to N at a time,
before glmc.pipeline.endpoints.get_endpoints loads them all from the cache.

Each endpoint trains in a worker process of its own (the spawn start method, so CUDA and the thread
pools start clean) exactly as the sequential loop would train it: under its cache entry's lock, through
the same `load_or_train`, from the same seed and data order, and it leaves its cache entry behind. Every
seed goes to one worker only, so no two processes write one entry (and the entry's lock keeps other runs
out as before). On a GPU the workers share the card; each worker gets torch threads = this process's
threads // N, so that N workers do not oversubscribe the cores. Workers send their log records to this
process, which writes them where its own go. A worker ends with this process, even one killed with
SIGKILL (glmc.train.parent_watch), so that no orphan trains on holding its seed's lock; a Ctrl-C or
SIGTERM of this process stops its workers at once (`stop_workers`) instead of waiting for their training.

The endpoint stage (glmc.pipeline.endpoints) gives the seeds to train and the function a worker runs
(`train_seed`), so this module knows processes, not endpoints. A worker that fails reports the seed it
trained; the seeds not started by then are not started, those running finish (their entries stay cached
for the next run), and the error names every failed seed.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from logging.handlers import QueueHandler, QueueListener
from pathlib import Path
from typing import Any

import torch

from glmc.config import Config
from glmc.train.parent_watch import end_with_parent

log = logging.getLogger(__name__)


class SeedFailed(Exception):
    """A worker's training of one seed failed: what it raised, as text (an exception of any kind pickles
    back this way), whether glmc raised it to refuse an input (glmc.pipeline.refusals), and its traceback."""

    def __init__(self, seed: int, message: str, refusal: bool, trace: str):
        super().__init__(seed, message, refusal, trace)
        self.seed, self.message, self.refusal, self.trace = seed, message, refusal, trace

    def __str__(self) -> str:
        named = self.message.startswith(f"seed {self.seed}:")  # e.g. a DivergenceError names it already
        return self.message if named else f"seed {self.seed}: {self.message}"


class SideBySideRefusal(RuntimeError):
    """Seeds whose workers refused their inputs (the run stops with the message, as for one process)."""


def train_side_by_side(
    cfg: Config, run_dir: Path, pretrained: Callable[[], Any], seeds_to_train: Callable, train_seed: Callable
) -> set[int]:
    """Train the endpoints not yet cached (`seeds_to_train(cfg)`: their index, seed and cache key) in up to
    train.parallel_endpoints processes at once, each running `train_seed(cfg, index, key, run_dir)`, which
    caches it; returns their seeds. Nothing is trained here with one endpoint to train (the sequential loop
    trains it, without a process's start-up cost), under torchrun (every rank trains each endpoint
    together) or with train.parallel_endpoints=1. `pretrained()`: the model pretrain.enabled endpoints
    start from, made here once so that the workers only load it from the cache."""
    if cfg.train.parallel_endpoints < 2 or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return set()
    todo = seeds_to_train(cfg)
    workers = min(cfg.train.parallel_endpoints, len(todo))
    if workers < 2:
        return set()
    if cfg.pretrain.enabled:
        pretrained()
    threads = max(1, torch.get_num_threads() // workers)
    seeds = [seed for _, seed, _ in todo]
    log.info("seeds %s: training side by side, %d at a time (%d torch threads each)", seeds, workers, threads)
    start = time.perf_counter()
    _run_workers(cfg, run_dir, todo, workers, threads, train_seed)
    log.info("seeds %s: trained and cached in %.1f s", seeds, time.perf_counter() - start)
    return set(seeds)


def _run_workers(cfg: Config, run_dir: Path, todo: list, workers: int, threads: int, train_seed: Callable) -> None:
    context = multiprocessing.get_context("spawn")
    records = context.Queue()
    relay = QueueListener(records, _Relay())
    relay.start()
    failed: list[SeedFailed] = []
    futures: dict[Any, int] = {}
    level = logging.getLogger().getEffectiveLevel()
    start = (records, threads, level, os.getpid())
    pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_start_worker, initargs=start)
    try:
        futures = {pool.submit(train_seed, cfg, index, key, str(run_dir)): seed for index, seed, key in todo}
        for future in as_completed(futures):
            if future.cancelled():
                continue
            seed = futures[future]
            try:
                log.info("seed %d: trained in a worker process (%.1f s)", seed, future.result())
            except SeedFailed as err:
                failed.append(err)
            except Exception as err:  # the worker itself died (killed, out of memory): no report from it
                failed.append(SeedFailed(seed, f"its worker process stopped ({type(err).__name__}: {err})", False, ""))
            if failed:
                for other in futures:
                    other.cancel()  # those not started yet; the running ones finish and stay cached
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (glmc.pipeline.run.Terminated): stop now, not after training
        stop_workers(pool)
        raise
    finally:
        # all done: the idle workers' interpreter teardown (seconds) overlaps with loading the endpoints
        pool.shutdown(wait=bool(failed) or any(not f.done() for f in futures), cancel_futures=True)
        relay.stop()
    if failed:
        raise_failures(failed)


def stop_workers(pool: ProcessPoolExecutor) -> None:
    """SIGTERM to every worker of `pool`: training there stops at its next step (Lightning's SIGTERM handling),
    elsewhere the worker ends at once; what it checkpointed stays for the next run to resume from."""
    for process in list((getattr(pool, "_processes", None) or {}).values()):  # no public handle before 3.14
        if process.is_alive():
            process.terminate()


def raise_failures(failed: list[SeedFailed]) -> None:
    """One error naming every failed seed: a refusal (its message alone on the command line) where each
    worker refused its input, else a RuntimeError that carries the workers' tracebacks."""
    failed = sorted(failed, key=lambda f: f.seed)
    message = "; ".join(str(f) for f in failed)
    if all(f.refusal for f in failed):
        raise SideBySideRefusal(message)
    traces = "\n".join(f"seed {f.seed}, in its worker process:\n{f.trace}" for f in failed if f.trace)
    raise RuntimeError(f"{message}\n{traces}".rstrip())


class _Relay:
    """Hands a worker's log record to this process's logger of the same name (and so to its handlers)."""

    def handle(self, record: logging.LogRecord) -> None:
        logging.getLogger(record.name).handle(record)


def _start_worker(records, threads: int, level: int, parent: int) -> None:
    """A worker's set-up, before it imports Lightning (which keeps its own handler where the root has none);
    the worker ends with `parent`, the run's process, however that ends (glmc.train.parent_watch)."""
    end_with_parent(parent)
    root = logging.getLogger()
    root.handlers[:] = [QueueHandler(records)]
    root.setLevel(level)
    torch.set_num_threads(threads)
