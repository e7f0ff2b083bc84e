"""Public entry points for people who bring their own models.

from glmc import to_canonical, align, interpolate, evaluate_path
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch

from glmc.matching.base import Alignment, MatchContext, Matcher
from glmc.matching.registry import METHODS, build_matcher, default_method_config
from glmc.models.compatibility import check_compatible
from glmc.models.convert import to_canonical


def align(
    model_a: torch.nn.Module,
    model_b: torch.nn.Module,
    matcher: str | Matcher = "weight",
    data: Any = None,
    *,
    run_dir: str | Path | None = None,
    trainer: dict[str, Any] | None = None,
    device: str | torch.device = "cpu",
    **options,
) -> Alignment:
    """Align model B to model A.

    `model_a`, `model_b`: HF models (ViTForImageClassification, GPT2LMHeadModel) or canonical ones.
    `matcher`: a method name from the registry (vanilla, canonical, weight_perm, weight, activation,
    activation_orth, rotation, learned, learned_perm, learned_sinkhorn) whose settings are overridden
    by `options` (e.g. max_iter=5, lr=1e-2; a misspelled option is an error naming it), or any object with a
    `match(a, b, context)` method. Data-driven methods need `data`, a DataLoader of training
    batches (inputs, targets). Learned matching trains with a Lightning Trainer (settings from
    `trainer`, e.g. {"accelerator": "gpu"}) and checkpoints into `run_dir` (a temporary folder if
    None, so nothing resumes).

    The two models must have the same architecture (family, layers, heads, head dims, MLP widths,
    width, vocabulary, positions, classes): a ValueError names the first difference. A matcher object
    with `equal_mlp_widths = False` may take MLPs of different widths.

    Returns an Alignment: `.model` is B transformed (same function as B), `.reference` is A in the
    same parameterisation, `.transform` the group elements, `.diagnostics` the method's record."""
    if isinstance(matcher, str):
        if matcher not in METHODS:
            raise ValueError(f"matcher={matcher!r} is not one of {list(METHODS)}")
        matcher = build_matcher(default_method_config(matcher, **options))
    elif options:
        raise TypeError("options apply to a matcher given by name")
    a, b = to_canonical(model_a), to_canonical(model_b)
    check_compatible(a, b, equal_mlp=getattr(matcher, "equal_mlp_widths", True))
    with tempfile.TemporaryDirectory(prefix="glmc-align-") as scratch:
        context = MatchContext(
            data=data, trainer=_trainer(trainer), run_dir=Path(run_dir or scratch), device=torch.device(device)
        )
        return matcher.match(a, b, context)


def _trainer(overrides: dict[str, Any] | None):
    from omegaconf import OmegaConf

    from glmc.config import TrainerConfig
    from glmc.train.trainer import trainer_factory

    cfg = OmegaConf.structured(TrainerConfig(accelerator="auto"))
    OmegaConf.set_struct(cfg, True)
    cfg.merge_with(overrides or {})  # a misspelled Trainer setting fails here, naming it
    return trainer_factory(cfg)
