"""Merges at the midpoint beyond the plain average (Fisher, RegMean) and the Hugging Face export of
a pair's midpoint model: both run after a method's path has been evaluated. Fine-tuned children of
different tasks merge with each model's statistics taken on its own data (own_data_merges)."""

from __future__ import annotations

import copy
import itertools
import json
import logging
import math
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from glmc.alignment import Alignment
from glmc.eval.evaluator import Evaluator
from glmc.interpolation import merge_params
from glmc.merging import fisher_average, fisher_information, gram_matrices, merged_model, regmean_from_grams
from glmc.metrics import is_token_task
from glmc.models.canonical import CanonicalTransformer, relative_deviation
from glmc.pipeline.export_files import TOKENIZER_FILES
from glmc.safe_files import atomic_write_text

log = logging.getLogger(__name__)


def canonical_pair(
    alignment: Alignment, a: CanonicalTransformer, b: CanonicalTransformer
) -> list[CanonicalTransformer]:
    """The factored canonical models a merge combines: the aligned pair, or for vanilla (which
    interpolates the original models) the unaligned canonical forms of A and B."""
    if isinstance(alignment.reference, CanonicalTransformer) and isinstance(alignment.model, CanonicalTransformer):
        return [alignment.reference, alignment.model]
    return [a, b]


def evaluate_merges(
    kinds: list[str],
    alignment: Alignment,
    a: CanonicalTransformer,
    b: CanonicalTransformer,
    evaluator: Evaluator,
    train_batches,
    batches: int,
    regmean_alpha: float,
) -> dict[str, dict[str, Any]]:
    """Test loss and accuracy of each merge of the pair at equal weights, and its seconds."""
    models = canonical_pair(alignment, a, b)
    out = {}
    for kind in kinds:
        options = {"alpha": regmean_alpha} if kind == "regmean" else {}
        start = time.perf_counter()
        merged = merged_model(kind, models, itertools.islice(iter(train_batches), batches), **options)
        seconds = time.perf_counter() - start
        loss, accuracy = evaluator.evaluate(merged)
        out[kind] = {
            "test_loss": loss,
            "test_accuracy": accuracy if evaluator.task == "classification" else None,
            "seconds": seconds,
        }
    return out


def own_statistics(kinds: list[str], model: CanonicalTransformer, batches: list) -> dict[str, tuple[Any, float]]:
    """kind -> (what merge `kind` needs of `model`, taken on `batches`: its own task's data; the seconds)."""
    out: dict[str, tuple[Any, float]] = {"average": (None, 0.0)}  # the average needs no data
    for kind, measure in (("fisher", fisher_information), ("regmean", gram_matrices)):
        if kind in kinds:
            start = time.perf_counter()
            out[kind] = (measure([model], batches)[0], time.perf_counter() - start)
    return out


def own_data_merges(kinds: list[str], a, b, stats: tuple[dict, dict], alpha: float) -> dict[str, tuple[Any, float]]:
    """kind -> (canonical A and B merged at equal weights, seconds including both models' statistics),
    each model's statistics its own (own_statistics): children of different tasks."""
    merge = {
        "average": lambda _: CanonicalTransformer(a.config, merge_params([a.params(), b.params()], [0.5, 0.5])),
        "fisher": lambda fishers: CanonicalTransformer(a.config, fisher_average([a.params(), b.params()], fishers)),
        "regmean": lambda grams: regmean_from_grams([a, b], grams, alpha=alpha),
    }
    out = {}
    for kind in kinds:
        start = time.perf_counter()
        with torch.no_grad():
            merged = merge[kind]([s[kind][0] for s in stats])
        out[kind] = (merged, time.perf_counter() - start + sum(s[kind][1] for s in stats))
    return out


# the dtypes a midpoint is written in: the stored dtypes of the models glmc aligns
EXPORT_DTYPES = ("float32", "bfloat16", "float16", "float64")


def export_midpoint(
    alignment: Alignment,
    template: torch.nn.Module,
    folder: Path,
    inputs: torch.Tensor,
    tokenizer: Any = None,
    tokenizer_folder: str | None = None,
    dtype: str = "float32",
    card: str | None = None,
    max_shard_size: str | int = "2GB",
) -> dict:
    """Write the pair's midpoint model as a Hugging Face folder with weights in `dtype` (the endpoints'
    stored dtype: the midpoint is computed in float32 and rounded once, when written) and check that it
    loads back with the same outputs (read back in float32: the relative deviation then holds the
    rounding to `dtype`); for text, the run's tokenizer goes beside it (save_tokenizer), so that the
    folder can be an endpoint again. Methods without an HF-shaped midpoint (circuit interpolation,
    residual maps that leave the mean-zero stream) are reported with the reason instead of failing the run.
    `card`: the folder's README.md (glmc.pipeline.model_card); `max_shard_size`: the most one weight file holds."""
    from glmc.models.export import export_hf

    if dtype not in EXPORT_DTYPES:  # e.g. a float8 checkpoint: written in the dtype it was aligned in
        dtype = "float32"
    mid, stored = alignment.interpolate(0.5), getattr(torch, dtype)
    try:
        if isinstance(mid, CanonicalTransformer):
            if alignment.circuits:
                raise ValueError(
                    f"interpolated as circuits ({', '.join(alignment.circuits)}): the merged heads have rank "
                    "up to 2 d_head and no Hugging Face shape (set the method's qk=none vo=none to export)"
                )
            export_hf(mid, template, folder, dtype=stored, max_shard_size=max_shard_size)
        else:  # vanilla: the interpolated original model is already an HF model
            rounded = mid if next(mid.parameters()).dtype == stored else copy.deepcopy(mid).to(stored)
            rounded.save_pretrained(folder, max_shard_size=max_shard_size)  # safetensors
    except ValueError as err:
        log.warning("not exported to %s: %s", folder, err)
        return {"exported": False, "reason": str(err)}
    loaded = type(template).from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = mid(inputs)
        expected = getattr(expected, "logits", expected)
        deviation = relative_deviation(loaded(inputs).logits, expected)
    out = {"exported": True, "path": str(folder), "dtype": dtype, "relative_deviation": deviation}
    if tokenizer is not None:  # images need none
        out["tokenizer"] = save_tokenizer(tokenizer, Path(folder), tokenizer_folder)
    if card is not None:
        atomic_write_text(Path(folder) / "README.md", card)
        out["card"] = str(Path(folder) / "README.md")
    return out


def save_tokenizer(tokenizer: Any, folder: Path, source: str | None = None) -> str:
    """Write the tokenizer the run encoded the text with beside an exported model and return what was
    done: a saved tokenizer's files are copied from `source` (data.tokenizer_path, or the first endpoint
    folder), a tokenizer built here (WordPiece, characters) is saved in Hugging Face form. A tokenizer
    with no such form is named, with the reason, in the folder's glmc_export.json instead."""
    from glmc.data.text import CharTokenizer
    from glmc.models.export import EXPORT_FILE

    if source and not isinstance(tokenizer, CharTokenizer):  # the character tokenizer reads no folder
        copied = [name for name in TOKENIZER_FILES if (Path(source) / name).is_file()]
        for name in copied:
            shutil.copyfile(Path(source) / name, folder / name)
        if copied:
            return f"copied from {source} ({', '.join(copied)})"
    if hasattr(tokenizer, "hf"):  # glmc.data.text.HFTokenizer (e.g. the hub's GPT-2)
        tokenizer.hf.save_pretrained(folder)
        return "saved with save_pretrained"
    if hasattr(tokenizer, "save"):  # glmc.data.wordpiece.WordPieceTokenizer, trained on the corpus
        tokenizer.save(folder)
        return "the WordPiece tokenizer trained on the corpus, saved as tokenizer.json"
    if hasattr(tokenizer, "to_hf"):
        tokenizer.to_hf().save_pretrained(folder)
        return "the character tokenizer of the corpus, saved as a word-level tokenizer.json with the same ids"
    note = (
        f"no tokenizer saved: the run's {type(tokenizer).__name__} has no Hugging Face form; encode text for "
        "this folder with the tokenizer the run used (give it as data.tokenizer_path)"
    )
    info_file = folder / EXPORT_FILE
    info = json.loads(info_file.read_text()) if info_file.is_file() else {}
    atomic_write_text(info_file, json.dumps({**info, "tokenizer": note}, indent=2) + "\n")
    log.warning("%s: %s", folder, note)
    return note


def format_merges(results: dict[str, Any]) -> str:
    """One row per method: the midpoint's test loss (accuracy or perplexity) for the plain average
    and for each merge; empty when no merge was asked for."""
    methods = {n: m for n, m in results["methods"].items() if "merges" in m}
    if not methods:
        return ""
    kinds = list(next(iter(methods.values()))["merges"])
    lm = is_token_task(results.get("task", ""))

    def cell(loss: float, accuracy: float | None) -> str:
        quality = f"ppl {math.exp(loss):.2f}" if lm else ("" if accuracy is None else f"{100 * accuracy:.1f}%")
        return f"{loss:.4f} {quality}"

    header = f"{'method':<18}" + "".join(f"{k:>22}" for k in ["average", *kinds])
    lines = ["", "midpoint merges (test loss):", header, "-" * len(header)]
    for name, m in methods.items():
        mid = len(m["lambdas"]) // 2
        row = [cell(m["test_loss"][mid], m["test_accuracy"][mid])]
        row += [cell(m["merges"][k]["test_loss"], m["merges"][k]["test_accuracy"]) for k in kinds]
        lines.append(f"{name:<18}" + "".join(f"{c:>22}" for c in row))
    return "\n".join(lines)
