"""Settings that only some endpoint modes (`endpoints=trained|pretrained|finetuned|spawn`) read: given where the
chosen mode does not read them, they would be recorded in results.json as if they had shaped the run, so the
check before any work refuses them, naming the key and the mode. A value a config file set (an experiment's
`endpoints.steps`, run with `endpoints=trained` for comparison) is not the user's request: only values given on
the command line are refused (every value that differs from the default where there is no command line)."""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

from glmc.config import Config

# key -> (its default, the modes that read it, what to do instead); endpoint_models with endpoints=pretrained
# is refused with the other trained-only settings (validate.TRAINED_ONLY)
READ_BY = {
    "endpoints.steps": ([0], ("spawn",), "add endpoints=spawn, or leave endpoints.steps out"),
    "endpoints.tasks": ([], ("finetuned",), "add endpoints=finetuned, or leave endpoints.tasks out"),
    "endpoint_models": (
        [],
        ("trained", "pretrained"),
        "the children share their parent's model: leave endpoint_models empty, or use endpoints=trained",
    ),
    "seed_vary": (
        "both",
        ("trained", "finetuned", "spawn"),
        "the folders are not trained here: leave seed_vary out",
    ),
}


def _requested(cfg: Config, key: str, default: Any) -> bool:
    """Whether `key` holds a value other than its default that the user asked for (see the module's note)."""
    value = OmegaConf.select(cfg, key)
    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value, resolve=True)
    if value == default or (isinstance(default, str) and str(value) == default):
        return False
    from hydra.core.hydra_config import HydraConfig

    from glmc.pipeline.folder_fit import command_line_value

    return not HydraConfig.initialized() or command_line_value(key) is not None


def endpoint_mode_problems(cfg: Config) -> list[str]:
    """The settings the chosen endpoint mode does not read, and endpoints=spawn's own: at least one step, and
    children that differ by their data order only (their weights are the parent's)."""
    source = str(cfg.endpoints.source)
    problems = []
    if source == "spawn" and not list(cfg.endpoints.steps):
        problems.append(
            "endpoints.steps=[]: endpoints=spawn starts its children from the parent's states at these optimizer "
            "steps; give at least one (e.g. endpoints.steps=[0,10,50])"
        )
    if source == "spawn" and str(cfg.seed_vary) == "init":
        problems.append(
            "seed_vary=init: with endpoints=spawn every child starts from the parent's weights and differs by its "
            "data order (and dropout) only; set seed_vary=data (or leave it out), or compare initialisations "
            "with endpoints=trained seed_vary=init"
        )
    for key, (default, modes, fix) in READ_BY.items():
        if source not in modes and _requested(cfg, key, default):
            value = OmegaConf.select(cfg, key)
            shown = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
            problems.append(f"{key}={shown}: not read with endpoints={source}; {fix}")
    return problems
