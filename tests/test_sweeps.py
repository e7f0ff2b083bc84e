"""Every sweep config composes in multirun mode and expands to the jobs it promises."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.types import RunMode
from omegaconf import OmegaConf

from glmc.matching.registry import METHODS

from conftest import CONF

SWEEPS = sorted(p.stem for p in (CONF / "sweep").glob("*.yaml"))
JOBS = {"matchers": len(METHODS), "learned_ablation": 8, "seeds": 3, "fig7": 14, "fig9": 4}


def expand(sweep: str, *extra: str):
    """The jobs the basic sweeper launches for `sweep=<name>`: one override list per job."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"sweep={sweep}", *extra], return_hydra_config=True)
    assert cfg.hydra.mode == RunMode.MULTIRUN, f"sweep/{sweep}.yaml must set hydra.mode: MULTIRUN"
    params = OmegaConf.to_container(cfg.hydra.sweeper.params, resolve=True)  # as the sweeper reads them
    parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()])
    (batch,) = BasicSweeper.split_arguments(parsed, max_batch_size=None)
    return cfg, batch


def test_every_sweep_config_has_a_job_count():
    assert set(SWEEPS) == set(JOBS)


@pytest.mark.parametrize("sweep", SWEEPS)
def test_sweep_composes_and_expands_to_its_jobs(sweep):
    cfg, jobs = expand(sweep)
    assert len(jobs) == JOBS[sweep]
    assert len({tuple(job) for job in jobs}) == len(jobs)  # no duplicate jobs
    # every job's overrides compose into a valid run config
    for job in jobs:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            compose(config_name="config", overrides=[f"sweep={sweep}", *job])


def test_matchers_sweep_runs_every_registered_method_once():
    _, jobs = expand("matchers")
    methods = [OmegaConf.from_dotlist(job).matcher.methods for job in jobs]
    assert all(len(m) == 1 for m in methods)
    assert sorted(m[0] for m in methods) == sorted(METHODS)


def test_learned_ablation_crosses_lambda_scheme_and_init():
    paper_schemes = ("fixed", "uniform_mid", "uniform", "gaussian")  # paper 001 Fig. 8 (arcsine is ours)
    cfg, jobs = expand("learned_ablation")
    assert list(cfg.matcher.methods) == ["learned"]
    settings = {
        (OmegaConf.from_dotlist(job).matcher.learned.lambda_scheme, OmegaConf.from_dotlist(job).matcher.learned.init)
        for job in jobs
    }
    assert settings == {(s, i) for s in paper_schemes for i in ("weight", "identity")}
