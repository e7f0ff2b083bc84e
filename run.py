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

    from glmc.pipeline.refusals import exit_if_refused, is_refusal, message_of
    from glmc.pipeline.sweep_report import clear_failed_job, record_failed_job

    hydra_cfg = HydraConfig.get()
    job_dir = hydra_cfg.runtime.output_dir
    try:
        value = run(cfg)
    except Exception as err:
        if hydra_cfg.mode == RunMode.RUN:
            exit_if_refused(err)
            raise
        # a sweep tells each failed job at once and goes on; SweepReport lists them all at its end
        record_failed_job(job_dir, hydra_cfg.job.num, list(hydra_cfg.overrides.task), message_of(err))
        if is_refusal(err):
            return float("nan")
        raise  # a fault inside a library keeps Hydra's traceback
    if hydra_cfg.mode != RunMode.RUN:
        clear_failed_job(job_dir)
    return value


def run(cfg: DictConfig) -> float:
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

    from glmc.pipeline.refusals import exit_on_unquoted_overrides

    exit_on_unquoted_overrides(sys.argv[1:])
    main()
