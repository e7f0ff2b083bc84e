"""Entry point: `python run.py [group=option ...] [key=value ...]`, `-m` for sweeps."""

from __future__ import annotations

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from glmc.config import register_configs

register_configs()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float:
    from hydra.types import RunMode

    from glmc.pipeline.refusals import exit_if_refused, message_of
    from glmc.pipeline.run_folder import FolderHeld, held_job_folder
    from glmc.pipeline.sweep_report import record_failed_job

    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode == RunMode.RUN:  # its folder is locked by RunFolderGuard
        try:
            return run(cfg)
        except Exception as err:
            exit_if_refused(err)
            raise
    job_dir = hydra_cfg.runtime.output_dir
    try:  # a sweep job's folder is locked as a single run's is, its failure record written under the lock
        with held_job_folder(job_dir):
            return sweep_job(cfg, job_dir)
    except FolderHeld as err:  # another run writes there: this sweep lists the job at its end
        record_failed_job(job_dir, hydra_cfg.job.num, list(hydra_cfg.overrides.task), message_of(err), write=False)
        return float("nan")


def sweep_job(cfg: DictConfig, job_dir: str) -> float:
    """One job of a multirun: a failure is told at once and the sweep goes on; SweepReport lists them all
    at its end."""
    from glmc.pipeline.refusals import is_refusal, message_of
    from glmc.pipeline.sweep_report import clear_failed_job, record_failed_job

    hydra_cfg = HydraConfig.get()
    try:
        value = run(cfg)
    except Exception as err:
        record_failed_job(job_dir, hydra_cfg.job.num, list(hydra_cfg.overrides.task), message_of(err))
        if is_refusal(err):
            return float("nan")
        raise  # a fault inside a library keeps Hydra's traceback
    clear_failed_job(job_dir)
    return value


def run(cfg: DictConfig) -> float:
    from glmc.pipeline.matplotlib_dir import use_cache_for_matplotlib

    use_cache_for_matplotlib(cfg.cache_dir)  # before the pipeline's imports bring in matplotlib
    from glmc.pipeline.run import run_pipeline  # heavy imports after Hydra has validated the config
    from glmc.threads import configure as configure_threads

    configure_threads(cfg.threads)  # auto: chosen again at each training stage from the cores free then
    results = run_pipeline(cfg, HydraConfig.get().runtime.output_dir)
    # The value a sweeper would minimise: the barrier of the last method listed (multi-model runs:
    # the simplex barrier of the last multi method).
    if "children" in results or "spawn" in results:  # finetuned: merge records; spawn: one barrier per step
        return float("nan")
    if "multi" in results:
        return results["multi"][cfg.multi.methods[-1]]["barrier"]
    return results["methods"][cfg.matcher.methods[-1]]["barrier"]


if __name__ == "__main__":
    import sys

    from glmc.pipeline.hydra_targets import exit_on_hydra_targets
    from glmc.pipeline.refusals import exit_on_unquoted_overrides

    exit_on_unquoted_overrides(sys.argv[1:])
    exit_on_hydra_targets(sys.argv[1:])  # Hydra builds its callbacks before glmc's checks see the config
    main()
