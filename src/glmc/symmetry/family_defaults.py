"""The symmetry set a model family admits when none is chosen: `residual=auto` becomes the widest class
of the family's residual stream (orthogonal for pre-norm families, permutation for post-norm ones). A
method follows `symmetry.residual` unless it has its own class (weight_perm, learned_perm) or the command
line sets one; against an explicit `symmetry.residual` such a setting is refused, under auto it is
recorded per method (results.json: symmetry.methods)."""

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


def _run_methods(cfg: Any) -> list[str]:
    """The methods a run builds: matcher.methods, and with pairing=universe the pairwise one."""
    names = list(cfg.matcher.methods)
    if cfg.get("pairing") == "universe" and "multi" in cfg and cfg.multi.pairwise in cfg.matcher:
        names.append(str(cfg.multi.pairwise))
    return list(dict.fromkeys(names))


def _follows_symmetry(name: str) -> bool:
    """Whether registered method `name` takes symmetry.residual unless told otherwise (weight, learned),
    rather than a class of its own (weight_perm, rotation) or another kind of setting (activation)."""
    from glmc.settings.methods import METHODS

    method = METHODS.get(name)
    return method is not None and getattr(method.make(), "residual", None) == "${symmetry.residual}"


def residual_contradictions(cfg: Any) -> list[str]:
    """For an explicit symmetry.residual (not auto): every run method that follows the symmetry group
    but was set to another residual class (`matcher.<name>.residual=...`), as a message naming both keys."""
    from omegaconf import OmegaConf

    chosen = str(cfg.symmetry.residual)
    if chosen == AUTO:
        return []
    problems = []
    for name in _run_methods(cfg):
        node = cfg.matcher.get(name)
        if node is None or "residual" not in node or OmegaConf.is_interpolation(node, "residual"):
            continue
        value = str(node.residual)
        if _follows_symmetry(name) and value not in (AUTO, chosen):
            problems.append(
                f"matcher.{name}.residual={value} contradicts symmetry.residual={chosen}: {name} would run "
                f"{value} while results.json records {chosen}; drop matcher.{name}.residual to follow the "
                f"symmetry group, or choose symmetry.residual={value} (symmetry=auto records a method's own "
                "class per method)"
            )
    return problems


def check_residual_classes(cfg: Any) -> None:
    """ValueError listing `residual_contradictions`, if any."""
    problems = residual_contradictions(cfg)
    if problems:
        raise ValueError("; ".join(problems))


def block_record(family: Any) -> dict[str, Any]:
    """The family's block kinds and the per-head spaces (qk, vo) they keep: which group the run used
    beyond the residual class (a query/key norm keeps no qk maps); "branch" names the kind on the
    sublayers' outputs where the family has one (sandwich norms: the residual stream is permuted only)."""
    attention, mlp = family.block_kinds("factored")
    record = {"attention": attention.name, "mlp": mlp.name, "head_spaces": sorted(attention.head_spaces)}
    branch = family.branch_block()
    return record if branch is None else {**record, "branch": branch.name}


def resolve_run_symmetry(cfg: Any, family: Any) -> dict[str, Any]:
    """After `check_residual_classes`, replace `auto` in a run config by the family's widest class (nothing
    where the family is unknown); returns results.json's record: residual, source, family, its "blocks"
    (block_record) and "methods" {name: class} for run methods with another class."""
    from omegaconf import OmegaConf

    check_residual_classes(cfg)
    if family is None:
        return {}
    residual, source = resolve_residual(cfg.symmetry.residual, family)
    cfg.symmetry.residual = residual
    for node in cfg.matcher.values():
        if OmegaConf.is_dict(node) and "residual" in node and not OmegaConf.is_interpolation(node, "residual"):
            if str(node.residual) == AUTO:
                node.residual = residual
    record: dict[str, Any] = {"residual": residual, "source": source, "family": family.name}
    record["blocks"] = block_record(family)
    own = {}
    for name in _run_methods(cfg):
        node = cfg.matcher.get(name)
        key = "residual_map" if node is not None and "residual_map" in node else "residual"
        if node is not None and key in node and str(node[key]) != residual:
            own[name] = str(node[key])  # e.g. weight_perm's permutation beside an orthogonal run
    return {**record, "methods": own} if own else record
