"""The task function: train (or load) endpoints -> align -> evaluate every path -> report.

With endpoints=pretrained the endpoints are Hugging Face model folders (glmc.pipeline.hf_folders): the
same stages run on them, with text encoded by their tokenizer and every endpoint labelled by its folder."""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf

from glmc.alignment import Alignment
from glmc.choices import EvalPrecision
from glmc.config import Config
from glmc.data.module import DataModule
from glmc.eval.barrier import barrier, barrier_vs_mean, lambda_grid, path_end_mismatches
from glmc.eval.evaluator import Evaluator, path_losses, run_evaluators
from glmc.host_memory import release_freed
from glmc.matching.base import MatchContext
from glmc.matching.registry import build_matcher, method_config
from glmc.metrics import is_token_task
from glmc.models.canonical import relative_deviation
from glmc.models.families import families_for_data, family_named
from glmc.pipeline.cache import config_hash
from glmc.pipeline.children import run_children, run_spawn, spawn_kept
from glmc.pipeline.endpoint_forms import DEVIATION_LOGITS_BYTES
from glmc.pipeline.endpoint_record import Endpoint
from glmc.pipeline.endpoints import cache_key, endpoint_ids, get_endpoints, seeds_of, training_kept
from glmc.pipeline.folder_fit import check_tokenizer
from glmc.pipeline.hf_folders import evaluation_config, is_pretrained
from glmc.pipeline.landscape import landscape_outputs, landscape_records
from glmc.pipeline.matrix import barrier_matrices
from glmc.pipeline.merges import evaluate_merges, export_midpoint, format_merges
from glmc.pipeline.model_card import model_card
from glmc.pipeline.multi import format_multi, model_name, run_multi
from glmc.pipeline.outputs import format_table, write_results
from glmc.pipeline.pairing import seed_pairs
from glmc.pipeline.previous_outputs import remove_previous_outputs
from glmc.pipeline.run_folder import check_run_dir
from glmc.pipeline.series import folder_series_configs, run_series, write_connectivity
from glmc.pipeline.tasks_run import check_tasks, format_tasks, task_summary
from glmc.pipeline.tracking import Tracker
from glmc.pipeline.validate import validate_config
from glmc.safe_files import atomic_write_text
from glmc.symmetry.embed_width import match_widths, same_shapes
from glmc.symmetry.family_defaults import resolve_run_symmetry
from glmc.train.latent_fit import fit_latents
from glmc.train.trainer import quiet_lightning, resolve_device, trained_precision, trainer_factory

log = logging.getLogger(__name__)


def summarise(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean curve and mean barrier over seed pairs (standard error when there are several)."""
    barriers = np.array([p["barrier"] for p in pairs])
    mean_curve = lambda key: [
        None if any(v is None for v in vals) else float(np.mean(vals))  # noqa: E731
        for vals in zip(*(p[key] for p in pairs))
    ]
    perplexity = (
        {"test_perplexity": [math.exp(x) for x in mean_curve("test_loss")]} if "test_perplexity" in pairs[0] else {}
    )
    merges = {}
    for kind in pairs[0].get("merges", {}):
        losses = np.array([p["merges"][kind]["test_loss"] for p in pairs])
        accuracies = [p["merges"][kind]["test_accuracy"] for p in pairs]
        merges[kind] = {
            "test_loss": float(losses.mean()),
            "test_loss_se": float(losses.std(ddof=1) / np.sqrt(len(losses))) if len(losses) > 1 else None,
            "test_accuracy": None if None in accuracies else float(np.mean(accuracies)),
            "seconds": float(np.mean([p["merges"][kind]["seconds"] for p in pairs])),
        }
    return {
        **({"merges": merges} if merges else {}),
        "barrier": float(barriers.mean()),
        "barrier_se": float(barriers.std(ddof=1) / np.sqrt(len(barriers))) if len(barriers) > 1 else None,
        "barrier_vs_mean": float(np.mean([p["barrier_vs_mean"] for p in pairs])),
        "lambdas": pairs[0]["lambdas"],
        "test_loss": mean_curve("test_loss"),
        "test_accuracy": mean_curve("test_accuracy"),
        **perplexity,
        "seconds": float(np.mean([p["seconds"] for p in pairs])),
        "pairs": pairs,
    }


def is_global_zero() -> bool:
    """Only one process writes results when the pipeline runs once per rank (torchrun, SLURM)."""
    return int(os.environ.get("RANK", 0)) == 0


def evaluate_alignment(
    evaluator: Evaluator,
    alignment: Alignment,
    b: Endpoint,
    lambdas: list[float],
    task: str,
    desc: str,
    end_losses: tuple[float, float] | None = None,
    endpoint_models: bool = False,
) -> dict[str, Any]:
    """The path's curve, barriers and how far the aligned B is from B (relative logit deviation).

    `end_losses` (A's and B's own losses on the evaluator's batches): a function-preserving path must
    start and end at them; a mismatch above float32 round-off is an error naming both values.
    `endpoint_models`: whether the run sets endpoint_models, which the error then names as a suspect."""
    curve = evaluator.path(alignment, lambdas, desc=desc)
    if end_losses is not None and alignment.function_preserving:
        mismatches = path_end_mismatches(lambdas, curve["loss"], *end_losses)
        if mismatches:
            suspect = " (a model setting of endpoint_models beyond the widths?)" if endpoint_models else ""
            raise ValueError(
                f"{desc}: the path does not end at its endpoints ({'; '.join(mismatches)}): the interpolated "
                f"model computes another function than the endpoint: a setting of B's forward taken from A{suspect}"
            )
    return {
        "barrier": barrier(lambdas, curve["loss"]),
        "barrier_vs_mean": barrier_vs_mean(lambdas, curve["loss"]),
        "lambdas": lambdas,
        "test_loss": curve["loss"],
        "test_accuracy": curve["accuracy"] if task == "classification" else [None] * len(lambdas),
        **({"test_perplexity": [math.exp(x) for x in curve["loss"]]} if is_token_task(task) else {}),
        "endpoint_deviation": relative_deviation(
            evaluator.logits(alignment.model, DEVIATION_LOGITS_BYTES), first_logits(evaluator, b)
        ),
        "function_preserving": alignment.function_preserving,
    }


def first_logits(evaluator: Evaluator, endpoint: Endpoint) -> torch.Tensor:
    """The endpoint's own logits on the evaluator's first batch (DEVIATION_LOGITS_BYTES of them), computed
    once per evaluator and kept with the endpoint (a large folder's: on disk beside its canonical form)."""
    key = id(evaluator)
    if endpoint.forms is not None:
        kept = endpoint.forms.logits(key)
        if kept is None:
            kept = evaluator.logits(endpoint.model, DEVIATION_LOGITS_BYTES)
            endpoint.forms.keep_logits(key, kept)
        return kept
    if key not in endpoint.logits:
        endpoint.logits[key] = evaluator.logits(endpoint.model, DEVIATION_LOGITS_BYTES)
    return endpoint.logits[key]


def check_vocabulary(cfg: Config, data: DataModule) -> None:
    """A text dataset's tokenizer must fit the model's embedding (every folder's, with endpoints=pretrained)."""
    if is_pretrained(cfg):
        return check_tokenizer(cfg, data.vocab_size)
    if data.vocab_size is not None and cfg.model.vocab_size < data.vocab_size:
        raise ValueError(
            f"model.vocab_size={cfg.model.vocab_size} is smaller than the {data.vocab_size} ids of "
            f"data.tokenizer={cfg.data.tokenizer} on data={cfg.data.name}"
        )
    if data.vocab_size is not None and family_named(str(cfg.model.family)).data_kind != "text":
        choices = " or ".join(f"model.family={name}" for name in families_for_data("text"))
        raise ValueError(f"data={cfg.data.name} is text: choose a language model ({choices})")


def interrupted_message(cfg: Config, run_dir: Path, stage: dict[str, str]) -> str:
    """One line for a Ctrl-C: where the checkpoints of the interrupted stage are and how to resume."""
    if is_pretrained(cfg):  # nothing is trained or cached; learned matching's checkpoints resume as below
        if stage.get("name") == "matching" and "checkpoint_every" in cfg.matcher[stage["method"]]:
            found = sorted(str(p) for p in (run_dir / stage["method"]).glob("pair_*/checkpoints/last.ckpt"))
            return (
                f"interrupted during {stage['method']} matching of {stage['pair']}: "
                + (f"checkpoints are in {', '.join(found)}" if found else "no checkpoint had been written yet")
                + f"; to resume, run the same command again into the same folder (hydra.run.dir={run_dir})"
            )
        return "interrupted: run the same command again (the endpoints are the folders of endpoints.paths)"
    cache = Path(cfg.cache_dir) / config_hash(cache_key(cfg))
    if stage.get("name") == "endpoints":  # say what was kept: cached seeds, checkpoints, seeds not begun
        kept = spawn_kept(cfg) if str(cfg.endpoints.source) == "spawn" else training_kept(cfg)
        return (
            f"interrupted while training endpoints: {kept}; run the same command again to resume "
            "(cached endpoints are reused)"
        )
    if stage.get("name") == "matching" and "checkpoint_every" not in cfg.matcher[stage["method"]]:
        return (
            f"interrupted during {stage['method']} matching of seeds {stage['pair']} (a method without "
            f"checkpoints): run the same command again; endpoints are cached in {cache}"
        )
    if stage.get("name") == "matching":
        method = stage["method"]
        found = sorted(str(p) for p in (run_dir / method).glob("pair_*/checkpoints/last.ckpt"))
        where = f"checkpoints are in {', '.join(found)}" if found else "no checkpoint had been written yet"
        return (
            f"interrupted during {method} matching of seeds {stage['pair']}: {where}; to resume, run the same "
            f"command again into the same folder (hydra.run.dir={run_dir}); endpoints are cached in {cache}"
        )
    return f"interrupted: endpoints are cached in {cache}; run the same command again to continue"


def _interrupted(err: BaseException) -> bool:
    """A Ctrl-C, or Lightning's exit after one (it turns KeyboardInterrupt into SystemExit(1))."""
    return isinstance(err, KeyboardInterrupt) or (
        isinstance(err, SystemExit) and isinstance(err.__context__, KeyboardInterrupt)
    )


class Terminated(KeyboardInterrupt):
    """SIGTERM (a cluster's preemption, `kill`) during run_pipeline. A KeyboardInterrupt, so that it
    takes Ctrl-C's path: Lightning stops training as it does for Ctrl-C and the run says where its
    checkpoints are; the process then exits with status 143 (128 + SIGTERM)."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated(f"received signal {signum}")


def _terminated(err: BaseException) -> bool:
    return isinstance(err, Terminated) or isinstance(err.__context__, Terminated)


def run_pipeline(cfg: Config, run_dir: Path) -> dict[str, Any]:
    """Validate, then run every stage; on Ctrl-C or SIGTERM say where the checkpoints are before exiting."""
    run_dir = Path(run_dir)
    symmetry = resolve_run_symmetry(cfg, validate_config(cfg))  # symmetry=auto: the family's widest set
    if check_run_dir(cfg, run_dir):  # overwrite=true: nothing of the replaced results stays
        remove_previous_outputs(run_dir)
    stage: dict[str, str] = {}
    main = threading.current_thread() is threading.main_thread()  # where signal handlers can be set
    sigint = signal.getsignal(signal.SIGINT) if main else None
    sigterm = signal.signal(signal.SIGTERM, _raise_terminated) if main else None
    try:
        return _run(cfg, run_dir, stage, symmetry)
    except (KeyboardInterrupt, SystemExit) as err:
        if not _interrupted(err):
            raise
        if main:
            signal.signal(signal.SIGTERM, sigterm or signal.SIG_DFL)  # a second SIGTERM acts as before the run
        if sigint is not None:
            signal.signal(signal.SIGINT, sigint)  # Lightning ignores further Ctrl-C after the first
        try:
            message = interrupted_message(cfg, run_dir, stage)
        except Exception as failure:  # never hide the interrupt behind a failing message
            message = f"interrupted (no checkpoint summary: {failure})"
        log.error(message)
        if _terminated(err):
            raise SystemExit(128 + signal.SIGTERM) from err
        raise
    finally:
        if main:
            signal.signal(signal.SIGTERM, sigterm or signal.SIG_DFL)


@dataclass
class PairRun:
    """What aligning one pair of endpoints needs from its run: the config and folder, the data, the
    evaluator of the paths, the endpoints and their own losses on its batches, and the tracker."""

    cfg: Config
    run_dir: Path
    data: DataModule
    evaluator: Evaluator
    endpoints: list[Endpoint]
    own: list[float] | None  # each endpoint's loss on the path's batches (None: not checked)
    lambdas: list[float]
    tracker: Tracker
    device: torch.device
    make_trainer: Callable[..., Any]

    def context(self, folder: Path, logger: Any) -> MatchContext:
        """A matcher's context: the training data, the trainer, its folder, its logger."""
        return MatchContext(
            data=self.data,
            trainer=self.make_trainer,
            run_dir=folder,
            device=self.device,
            logger=logger,
            fit=fit_latents,
            path_loss=path_losses,
        )


def align_pair(
    run: PairRun, name: str, matcher: Any, ia: int, ib: int, stage: dict[str, str], export: bool = False
) -> dict[str, Any]:
    """Aligns endpoint ib to endpoint ia by one method, evaluates its paths (`export`: and exports its
    midpoint, where merge.export asks) and writes its diagnostics; returns the pair's record."""
    cfg, tracker = run.cfg, run.tracker
    a, b = run.endpoints[ia], run.endpoints[ib]
    label = f"{a.label}-{b.label}"
    stage.update(name="matching", method=name, pair=label)
    logger = lambda method, label=label: tracker.lightning_logger(f"{method}_{label}", "match")  # noqa: E731
    context = run.context(run.run_dir / name, logger)
    start = time.perf_counter()
    if getattr(matcher, "interpolates_originals", False):  # vanilla: the models as given, no canonical form built
        alignment = matcher.match(a.model, b.model, context)
    else:
        # read once (a large folder's form is built on each use); a narrower B is embedded exactly into A's
        # shapes first (width-heterogeneous runs)
        a_canonical, b_canonical = a.canonical, b.canonical
        if not same_shapes(a_canonical, b_canonical):  # the embedding's residual map is seeded
            seeded = torch.Generator().manual_seed(b.seed)
            b_canonical = match_widths(a_canonical, b_canonical, seeded, str(cfg.embed_stream))
        context.lean_memory = b.built_on_use  # B's copy is this pair's own; the search holds little
        if b.built_on_use:  # the last stage's freed memory back to the system before a large search
            release_freed()
        alignment = matcher.match(a_canonical, b_canonical, context)
        del a_canonical, b_canonical  # what the alignment holds of them stays
    # a resumed learned run: with the fit time of the attempts before its checkpoint
    seconds = time.perf_counter() - start + (alignment.diagnostics or {}).get("seconds_before_resume", 0.0)
    ends = None if run.own is None else (run.own[ia], run.own[ib])
    result = pair_paths(run, name, label, alignment, (a, b), ends, context, export)
    if alignment.diagnostics:  # e.g. weight matching's objective per iteration
        diag_file = run.run_dir / name / f"diagnostics_{label}.json"
        atomic_write_text(diag_file, json.dumps(alignment.diagnostics, indent=2))
    names = {"endpoints": [a.name, b.name]} if a.name is not None else {}
    return {"seeds": [a.seed, b.seed], **names, **result, "seconds": seconds, "diagnostics": alignment.diagnostics}


def pair_paths(
    run: PairRun,
    name: str,
    label: str,
    alignment: Alignment,
    pair: tuple[Endpoint, Endpoint],
    ends: tuple[float, float] | None,
    context: MatchContext,
    export: bool,
) -> dict[str, Any]:
    """The aligned pair's paths (its own, its variants', the merges') and, with `export`, its midpoint
    exported as a Hugging Face folder."""
    cfg, evaluator, lambdas, task = run.cfg, run.evaluator, run.lambdas, run.cfg.data.task
    a, b = pair
    result = evaluate_alignment(
        evaluator, alignment, b, lambdas, task, f"{name} {label}", ends, bool(cfg.endpoint_models)
    )
    result.update(landscape_records(run, name, label, alignment, pair, context))  # where the path breaks
    for variant, other in alignment.variants.items():  # e.g. a Sinkhorn run's hard projection
        result[variant] = evaluate_alignment(evaluator, other, b, lambdas, task, f"{name} {variant}")
    if cfg.merge.kinds:
        result["merges"] = evaluate_merges(
            list(cfg.merge.kinds),
            alignment,
            a.canonical,
            b.canonical,
            evaluator,
            context.train_batches("merging"),
            cfg.merge.batches,
            cfg.merge.regmean_alpha,
        )
    if cfg.merge.export and export:
        inputs = next(iter(run.data.test_dataloader()))[0][:8]
        folder, source = run.run_dir / name / f"hf_{label}", evaluation_config(cfg).data.tokenizer_path
        # written in A's stored dtype: the folders' own (mixed dtypes: hf_folders.mixed_dtypes_warning)
        card = model_card(cfg, name, pair, result)
        shard = cfg.merge.export_max_shard
        result["export"] = export_midpoint(
            alignment, a.model, folder, inputs, run.data.tokenizer, source, a.dtype, card, shard
        )
    return result


def measure_methods(
    run: PairRun, matchers: dict[str, Any], pairs: list[tuple[int, int]], stage: dict[str, str], export: bool = False
) -> dict[str, Any]:
    """Every method's summary over the pairs of `run`'s endpoints (`export`: the first pair's midpoint too)."""
    methods = {}
    for name, matcher in matchers.items():
        pair_results = [
            align_pair(run, name, matcher, ia, ib, stage, export and (ia, ib) == pairs[0]) for ia, ib in pairs
        ]
        stage.clear()
        methods[name] = summarise(pair_results)
        log.info("%s: barrier %.4f", name, methods[name]["barrier"])
    return methods


# what the barrier's losses were computed in, by eval.precision: the models are float32 throughout (a
# folder stored in bfloat16 or float16 is converted exactly at load), and autocast runs matmuls in half
EVAL_DTYPES = {"32": "float32", "bf16": "bfloat16 autocast", "16": "float16 autocast"}


def stored_dtype(endpoints: list[Endpoint]) -> str:
    """The dtype the endpoints' weights are stored in (trained endpoints: float32), or "mixed" (each
    endpoint's own is in results.json's endpoints)."""
    dtypes = {e.dtype for e in endpoints}
    return dtypes.pop() if len(dtypes) == 1 else "mixed"


def _results(
    cfg: Config, endpoints: list[Endpoint], device: torch.device, methods: dict[str, Any], multi: dict | None
) -> dict[str, Any]:
    """The run's results.json record."""
    task = cfg.data.task
    return {
        "experiment": cfg.experiment,
        "model": model_name(cfg, endpoints),  # endpoints=pretrained: the family and the folders' names
        "dataset": cfg.data.name,
        "task": task,
        "split": cfg.eval.split,
        "device": str(device),
        # what endpoints and learned latents trained in (trainer.precision=auto resolved); weights are float32
        "train_precision": trained_precision(cfg.trainer),
        "eval_dtype": EVAL_DTYPES[str(cfg.eval.precision)],
        "stored_dtype": stored_dtype(endpoints),
        "endpoints": [
            {
                "seed": e.seed,
                **({"name": e.name, "path": e.path} if e.name is not None else seeds_of(cfg, e.seed)),
                "stored_dtype": e.dtype,
                "width": e.width,
                "test_loss": e.test_loss,
                "test_accuracy": e.test_accuracy if task == "classification" else None,
                "cached": e.cached,
                **({"kept": e.kept} if e.kept else {}),  # early stopping: the best epoch and its val_loss
            }
            for e in endpoints
        ],
        "methods": methods,
        **({"multi": multi} if multi is not None else {}),
        "config": OmegaConf.to_container(cfg, resolve=True),
    }


def _print_summary(results: dict[str, Any], multi: dict | None, run_dir: Path, endpoints: list[Endpoint]) -> None:
    if multi:
        print(format_table(results).split("\n\n")[0] + format_multi(multi))
        print(f"\nwrote {run_dir / 'results.json'}" + (", simplex.png" if len(endpoints) == 3 else ""))
    else:
        print(format_table(results) + format_merges(results) + format_tasks(results))
        print(f"\nwrote {run_dir / 'results.json'}, barrier.csv, barrier.png")


def _run(cfg: Config, run_dir: Path, stage: dict[str, str], symmetry: dict[str, str]) -> dict[str, Any]:
    quiet_lightning()
    run_dir.mkdir(parents=True, exist_ok=True)
    check_tasks(cfg)  # every eval.tasks name known to lm-eval (or a file), before any training
    if str(cfg.endpoints.source) == "finetuned":  # children of several tasks, paired within and across tasks
        return run_children(cfg, run_dir, stage)
    given, configs = cfg, folder_series_configs(cfg)[0]  # a series of folders: one config per step
    cfg = configs[-1]  # its last step's folders are the run's endpoints
    # a method's own checks of its settings fail here, before any training
    pairs = seed_pairs(endpoint_ids(cfg), cfg.pairing)
    lambdas = lambda_grid(cfg.eval.num_lambdas)
    universe = cfg.pairing == "universe"
    matchers = {} if universe else {name: build_matcher(method_config(cfg, name)) for name in cfg.matcher.methods}
    device = resolve_device(cfg.trainer.accelerator)
    with Tracker(cfg, run_dir) as tracker:
        data = DataModule(evaluation_config(cfg).data, seed=0)  # pretrained text: the folders' tokenizer
        data.setup()
        check_vocabulary(cfg, data)
        test, evaluator = run_evaluators(cfg, data, device)
        if str(cfg.endpoints.source) == "spawn":  # children of one parent at each spawn step, measured per step
            make_trainer = trainer_factory(cfg.trainer)
            run = PairRun(cfg, run_dir, data, evaluator, [], None, lambdas, tracker, device, make_trainer)
            at_step = lambda ends, own, folder: measure_methods(  # noqa: E731
                replace(run, endpoints=ends, own=own, run_dir=run_dir / folder), matchers, pairs, stage
            )
            return run_spawn(cfg, run_dir, stage, test, evaluator, tracker, at_step)
        stage["name"] = "endpoints"
        endpoints = get_endpoints(cfg, run_dir, tracker, test)
        # every endpoint's own loss on the path's batches, where each function-preserving path must end
        # (under autocast the two forwards round differently: no check)
        own = None
        if cfg.eval.precision == EvalPrecision.full:
            own = [e.test_loss if evaluator is test else evaluator.evaluate(e.model)[0] for e in endpoints]
        for e in endpoints:  # a large folder's model is built now, one at a time, not beside a pair's forms
            if e.built_on_use:
                first_logits(evaluator, e)
                release_freed()
        make_trainer = trainer_factory(cfg.trainer)
        run = PairRun(cfg, run_dir, data, evaluator, endpoints, own, lambdas, tracker, device, make_trainer)
        methods = measure_methods(run, matchers, pairs, stage, export=True)
        series = None
        if cfg.train.save_steps is not None or len(configs) > 1:  # the same methods at every saved step
            at_step = lambda ends, own, folder: measure_methods(  # noqa: E731
                replace(run, endpoints=ends, own=own, run_dir=run_dir / folder), matchers, pairs, stage
            )
            series = run_series(cfg, configs, run_dir, tracker, endpoints, (test, evaluator), at_step)
        multi = None
        if universe:
            stage.update(name="matching", method="universe", pair="all")
            logger = lambda method: tracker.lightning_logger(f"{method}_universe", "match")  # noqa: E731
            multi = run_multi(cfg, run_dir, endpoints, evaluator, run.context(run_dir / "universe", logger))
            stage.clear()
        results = _results(cfg, endpoints, device, methods, multi)
        if cfg.eval.tasks:
            results["tasks"] = task_summary(results)
        if given is not cfg:  # a series of folders: the config as given, every step's folders
            results["config"] = OmegaConf.to_container(given, resolve=True)
        results["symmetry"] = symmetry  # the residual class used and whether the family chose it
        matrices = barrier_matrices(cfg, endpoints, pairs, methods, multi)  # three or more endpoints
        results.update({"series": series} if series else {}, **({"matrix": matrices} if matrices else {}))
        if is_global_zero():
            write_results(results, run_dir)
            tracker.log_results(results)
            write_connectivity(results, run_dir, tracker)  # series.png, matrix_*.csv, matrix.png
            landscape_outputs(results, run_dir, tracker)  # e.g. layerwise.png
    if is_global_zero():
        _print_summary(results, multi, run_dir, endpoints)
    return results
