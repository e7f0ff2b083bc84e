"""Experiment tracking: CSV logs by default, Weights & Biases (offline unless opted in) on request.

`Tracker` is a context manager so that `wandb.finish()` runs whether the run succeeds or fails,
and the next job of a multirun starts a fresh W&B run instead of logging into a dead one.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import CSVLogger
from omegaconf import OmegaConf

from glmc.config import Config

log = logging.getLogger(__name__)


class Tracker:
    def __init__(self, cfg: Config, run_dir: Path):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.kind = cfg.logger.kind
        if self.kind not in ("csv", "wandb", "none"):
            raise ValueError(f"logger.kind={self.kind!r} is not one of csv, wandb, none")
        self.run = None

    def __enter__(self) -> "Tracker":
        if self.kind == "wandb":
            import wandb

            lcfg = self.cfg.logger
            if lcfg.mode not in ("offline", "online", "disabled"):
                raise ValueError(f"logger.mode={lcfg.mode!r} is not one of offline, online, disabled")
            self.run = wandb.init(
                project=lcfg.project,
                entity=lcfg.entity,
                group=lcfg.group,
                tags=list(lcfg.tags),
                mode=lcfg.mode,
                dir=str(self.run_dir),
                name=f"{self.cfg.experiment}-{self.run_dir.name}",
                config=OmegaConf.to_container(self.cfg, resolve=True),
                reinit="finish_previous",
            )
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.run is not None:
            import wandb

            wandb.finish(exit_code=1 if exc_type is not None else 0)
            self.run = None

    def lightning_logger(self, name: str) -> Any:
        """A Lightning logger for one training stage (endpoint seed or learned matching)."""
        if self.kind == "csv":
            return CSVLogger(save_dir=str(self.run_dir), name="logs", version=name)
        if self.kind == "wandb":
            from lightning.pytorch.loggers import WandbLogger

            return WandbLogger(experiment=self.run, prefix=name)
        return False

    def log_results(self, results: dict[str, Any]) -> None:
        """Barrier curves as a table and line plots; barriers and endpoint metrics in the summary."""
        if self.run is None:
            return
        import wandb

        methods = results["methods"]
        rows = []
        for name, m in methods.items():
            for lam, loss, acc in zip(m["lambdas"], m["test_loss"], m["test_accuracy"]):
                rows.append([name, lam, "test", loss, acc])
        table = wandb.Table(columns=["method", "lambda", "split", "loss", "accuracy"], data=rows)
        names = list(methods)
        lambdas = methods[names[0]]["lambdas"]
        plots = {
            f"barrier_curve/{metric}": wandb.plot.line_series(
                xs=lambdas,
                ys=[methods[n][key] for n in names],
                keys=names,
                title=f"test {metric} along the path",
                xname="lambda",
            )
            for metric, key in (("loss", "test_loss"), ("accuracy", "test_accuracy"))
        }
        self.run.log({"barrier_curves": table, **plots})
        for name, m in methods.items():
            self.run.summary[f"{name}/barrier"] = m["barrier"]
            self.run.summary[f"{name}/barrier_vs_mean"] = m["barrier_vs_mean"]
        for e in results["endpoints"]:
            self.run.summary[f"seed_{e['seed']}/test_loss"] = e["test_loss"]
            self.run.summary[f"seed_{e['seed']}/test_accuracy"] = e["test_accuracy"]
        if (self.run_dir / "barrier.png").exists():
            self.run.log({"barrier_png": wandb.Image(str(self.run_dir / "barrier.png"))})
