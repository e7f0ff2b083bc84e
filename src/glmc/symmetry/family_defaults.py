"""The symmetry set a model family admits when none is chosen: `residual=auto` becomes the widest class
of the family's residual stream (its `residual_classes`, widest first): orthogonal for the pre-norm
families, whose stream passes through a parameter-free RMS norm before every reader, permutation for
the post-norm ones (BERT, RoBERTa), whose stream is a LayerNorm's output. An explicit class is kept, so
one the family cannot take is still refused by the config check or by `apply`."""

from __future__ import annotations

from typing import Any

AUTO = "auto"


def widest_residual(family: Any) -> str:
    """The widest residual class of `family` (a glmc.models.families Family)."""
    return family.residual_classes[0]


def resolve_residual(value: Any, family: Any) -> tuple[str, str]:
    """(the residual class to use, where it came from: "family default" or "chosen")."""
    if str(value) == AUTO:
        return widest_residual(family), "family default"
    return str(value), "chosen"


def resolve_run_symmetry(cfg: Any, family: Any) -> dict[str, str]:
    """Replace `auto` in a run config (symmetry.residual, and any method node set to auto itself) by the
    family's widest class; returns what results.json records: {"residual", "source"}. Nothing changes
    where the family is not known."""
    from omegaconf import OmegaConf

    if family is None:
        return {}
    residual, source = resolve_residual(cfg.symmetry.residual, family)
    cfg.symmetry.residual = residual
    for node in cfg.matcher.values():
        if OmegaConf.is_dict(node) and "residual" in node and not OmegaConf.is_interpolation(node, "residual"):
            if str(node.residual) == AUTO:
                node.residual = residual
    return {"residual": residual, "source": source, "family": family.name}
