"""The model card of an exported folder (merge.export): README.md with the YAML header Hugging Face reads
(library, tags, the endpoints as base models where they are folders or hub names), then how the model was
made: the two endpoints, the method and its settings, lambda, the loss barrier of the path it lies on,
the task scores measured there (eval.tasks) and the glmc version."""

from __future__ import annotations

import json
from importlib import metadata
from typing import Any

from omegaconf import OmegaConf

# the line after the header that marks a card as glmc's (overwrite=true removes it, never a user's README.md)
CARD_MARK = "<!-- model card written by glmc -->"


def glmc_version() -> str:
    try:
        return metadata.version("glmc")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def _endpoint(e: Any) -> str:
    return str(e.name) if getattr(e, "name", None) is not None else f"seed {e.seed}"


def _architecture(cfg: Any, a: Any) -> str:
    """model.name, or for a user's folder (endpoints=pretrained) its Hugging Face class."""
    if getattr(a, "name", None) is not None:
        return type(a.model).__name__
    return str(cfg.model.name) if cfg else "unknown"


def model_card(cfg: Any, method: str, pair: tuple, record: dict[str, Any], lam: float = 0.5, what: str = "") -> str:
    """README.md text for the point at `lam` (1 = A) of method `method`'s path between `pair` (`what`: what
    the folder holds where it is not that straight line's point); `record`: the pair's record so far (its
    barrier, test loss, task curves)."""
    a, b = pair
    names = [_endpoint(a), _endpoint(b)]
    header = ["---", "library_name: transformers", "tags:"]
    header += [f"  - {tag}" for tag in ("glmc", "model-merging", "linear-mode-connectivity")]
    folders = [e.name for e in pair if getattr(e, "name", None)]
    if folders:
        header += ["base_model:"] + [f"  - {json.dumps(str(n))}" for n in folders]
    header.append("---")
    settings = OmegaConf.to_container(cfg.matcher[method], resolve=True) if cfg and method in cfg.matcher else {}
    lines = [
        f"# {method}: the point at lambda = {lam:g} between {names[0]} (A) and {names[1]} (B)",
        "",
        f"Made by glmc {glmc_version()}: model B aligned to model A by `{method}`; this folder holds "
        + (what or f"{lam:g} * A + {1 - lam:g} * aligned B, a point of the straight line between them")
        + ".",
        "",
        f"- model: {_architecture(cfg, a)}; data: {cfg.data.name if cfg else 'unknown'}",
        f"- endpoints: A = {names[0]}, B = {names[1]}",
        f"- method settings: `{json.dumps(settings, sort_keys=True)}`" if settings else f"- method: {method}",
    ]
    if "barrier" in record:
        lines.append(f"- loss barrier of the path: {record['barrier']:.4f} nats (test split)")
    losses, lambdas = record.get("test_loss"), record.get("lambdas")
    if losses and lambdas and lam in lambdas:
        lines.append(f"- test loss here: {losses[lambdas.index(lam)]:.4f}")
    tasks = (record.get("tasks") or {}).get("tasks") or {}
    if tasks:
        lines += ["", "Task scores (lm-evaluation-harness) along the path:", "", "| task | metric | here | barrier |"]
        lines.append("|---|---|---|---|")
        path_lambdas = record["tasks"]["lambdas"]
        for task, metrics in tasks.items():
            for metric, entry in metrics.items():
                here = f"{entry['values'][path_lambdas.index(lam)]:.4f}" if lam in path_lambdas else "-"
                lines.append(f"| {task} | {metric} | {here} | {entry['barrier']:.4f} |")
    return "\n".join(header + [CARD_MARK, ""] + lines) + "\n"
