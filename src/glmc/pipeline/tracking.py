"""Experiment tracking: CSV logs by default, Weights & Biases (offline unless opted in) on request.

With W&B every stage of a pipeline run is its own W&B run, and all of them share one group (the
experiment name unless `logger.group` says otherwise):

    job_type "train"     one run per endpoint seed          (name "<experiment>/seed_<n>")
    job_type "match"     one run per learned-matching pair  (name "<experiment>/<method>_<a>-<b>")
    job_type "curve"     one run per method and seed pair   (name "<experiment>/<method>_<a>-<b>")
    job_type "evaluate"  barrier curves, summary, results   (name "<experiment>/evaluate")

Metric keys never carry a stage name or a parameter fingerprint (`train_loss`, `val_loss`,
`val_acc`, `match_loss`, `lambda`, `barrier_curve/loss`, ...), so runs of different experiments line
up on one dashboard; the group, job type and run name say where a run belongs.

A curve run holds one history row per interpolation weight (`curve/lambda`, `curve/test_loss`,
`curve/test_accuracy`) and `method`, `seeds`, `experiment`, `model`, `dataset` in its config, so a line
plot of curve/test_loss against curve/lambda grouped by config `method` averages the seed pairs of a
method, within one experiment or across a sweep (see glmc.pipeline.workspace).

`Tracker` is a context manager: on exit the open W&B run is finished (exit code 1 when an exception
is propagating), so the next job of a multirun starts a fresh run instead of logging into a dead one.

W&B writes its logs, settings, artifact staging and downloads under the home directory by default.
While a tracker is open, every such folder the user has not named (WANDB_DIR, WANDB_CACHE_DIR,
WANDB_CONFIG_DIR, WANDB_DATA_DIR, WANDB_ARTIFACT_DIR) lies inside the run folder, so a run writes
nothing outside it but W&B's own temporary files; on exit the variables are restored. W&B's background
service keeps the cache folder it started with for its logs: when that folder is the run's, the service
lives as long as the tracker.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import CSVLogger
from omegaconf import OmegaConf

from glmc.config import Config

log = logging.getLogger(__name__)

KINDS = ("csv", "wandb", "none")
MODES = ("offline", "online", "disabled")
EVALUATE = "evaluate"
CURVE = "curve"
RESULT_FILES = ("results.json", "barrier.csv", "barrier.png")
SERVICE_LOGS = "WANDB_CACHE_DIR"  # where W&B's background service writes its logs
# W&B's folders besides its runs, by the variable that names each: inside <run dir>/wandb/ unless set
WANDB_FOLDERS = {
    "WANDB_CACHE_DIR": "cache",
    "WANDB_CONFIG_DIR": "config",
    "WANDB_DATA_DIR": "data",
    "WANDB_ARTIFACT_DIR": "artifacts",
}


def _artifact_name(text: str) -> str:
    """W&B artifact names may hold letters, digits, '-', '_' and '.' only."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "run"


class Tracker:
    """Hands out one Lightning logger per training stage and logs the final results.

    `run` is the W&B run opened last (None before the first stage, with csv/none, and after exit);
    `runs` keeps every W&B run this tracker started, in order.
    """

    def __init__(self, cfg: Config, run_dir: Path):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.kind = str(cfg.logger.kind)
        if self.kind not in KINDS:
            raise ValueError(f"logger.kind={self.kind!r} is not one of {', '.join(KINDS)}")
        if self.kind == "wandb" and str(cfg.logger.mode) not in MODES:
            raise ValueError(f"logger.mode={cfg.logger.mode!r} is not one of {', '.join(MODES)}")
        self.run: Any = None
        self.runs: list[Any] = []
        self._set_env: list[str] = []  # the W&B folder variables this tracker set (`_own_folders`)

    # -- context manager -------------------------------------------------------------------------

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self._finish(exit_code=1 if exc_type is not None else 0)
            if self.runs and SERVICE_LOGS in self._set_env:
                import wandb

                wandb.teardown()  # its service would write the next tracker's logs into this run folder
        except Exception:
            if exc_type is None:
                raise
            # never hide the exception that is already on its way out
            log.exception("could not finish the W&B run while handling another error")
        finally:
            self.run = None
            for var in self._set_env:
                os.environ.pop(var, None)
            self._set_env = []

    def _own_folders(self) -> str:
        """Point every W&B folder variable the user has not set into the run folder (WANDB_DIR: the run
        folder, which holds wandb/; the others: WANDB_FOLDERS) until exit. Returns WANDB_DIR.

        W&B's background service writes its logs into the cache folder it started with: when that folder is
        this run's, a service started before is shut down first, and this one on exit."""
        folders = {"WANDB_DIR": self.run_dir, **{v: self.run_dir / "wandb" / f for v, f in WANDB_FOLDERS.items()}}
        for var, folder in folders.items():
            if not os.environ.get(var):
                os.environ[var] = str(folder)
                self._set_env.append(var)
                if var == SERVICE_LOGS:
                    import wandb

                    wandb.teardown()
        return os.environ["WANDB_DIR"]

    # -- W&B runs ----------------------------------------------------------------------------------

    @property
    def group(self) -> str:
        group = self.cfg.logger.group
        return str(group) if group else str(self.cfg.experiment)

    def _finish(self, exit_code: int = 0) -> None:
        run, self.run = self.run, None
        if run is not None:
            run.finish(exit_code=exit_code)

    def _start(self, name: str, job_type: str, config: dict[str, Any] | None = None) -> Any:
        """Finish the open stage run, if any, and start the run of the next stage.

        config: the run's W&B config; the resolved pipeline config when None.
        """
        root = self._own_folders()  # before W&B reads its settings
        import wandb

        self._finish()
        lcfg = self.cfg.logger
        if config is None:
            config = OmegaConf.to_container(self.cfg, resolve=True, enum_to_str=True)
        self.run = wandb.init(
            project=lcfg.project,
            entity=lcfg.entity,
            group=self.group,
            job_type=job_type,
            name=f"{self.cfg.experiment}/{name}",
            tags=[str(t) for t in (lcfg.tags or [])],
            mode=str(lcfg.mode),
            dir=root,
            config=config,
            reinit="finish_previous",  # also closes a run some other code left open
        )
        self.runs.append(self.run)
        return self.run

    # -- public interface ----------------------------------------------------------------------------

    def lightning_logger(self, name: str, job_type: str) -> Any:
        """A Lightning logger for one training stage.

        name: `seed_<n>` for an endpoint (job_type "train"), `<method>_<a>-<b>` for a learned-matching
        pair (job_type "match"). csv: `<run_dir>/logs/<name>/metrics.csv` (`<name>.2`, ... when a rerun
        in the same folder finds earlier logs there: they are kept); wandb: a new run in the
        experiment's group, whose metric keys are the ones the LightningModule logs, unprefixed;
        none: False (Lightning's "no logger").
        """
        if self.kind == "csv":
            return CSVLogger(save_dir=str(self.run_dir), name="logs", version=self._fresh_version(name))
        if self.kind == "wandb":
            from lightning.pytorch.loggers import WandbLogger

            run = self._start(name, job_type)
            # what WandbLogger sets up itself when it creates the run: plot against Lightning's step
            run.define_metric("trainer/global_step")
            run.define_metric("*", step_metric="trainer/global_step", step_sync=True)
            return WandbLogger(experiment=run, save_dir=str(self.run_dir), project=self.cfg.logger.project)
        return False

    def log_curves(self, results: dict[str, Any]) -> list[Any]:
        """One run of job_type "curve" per method and seed pair, named `<method>_<a>-<b>`.

        Its history has one row per λ (`curve/lambda`, `curve/test_loss`, `curve/test_accuracy`
        where the task has one, `curve/test_perplexity` for language models), plotted against
        curve/lambda; its summary holds the pair's barrier and barrier_vs_mean. Returns the runs
        (none for csv/none); each is finished when the next one starts.
        """
        if self.kind != "wandb":
            return []
        runs = []
        pipeline = OmegaConf.to_container(self.cfg, resolve=True, enum_to_str=True)
        for method, summary in results.get("methods", {}).items():
            # a summary of one pair may come without the list of pairs, and without its seeds: the
            # pipeline's first pair is always the first two seeds
            for pair in summary.get("pairs") or [summary]:
                # endpoints=pretrained: the folders' names
                a, b = pair.get("endpoints") or pair.get("seeds") or list(self.cfg.seeds)[:2]
                config = {
                    "method": method,
                    "seeds": f"{a}-{b}",
                    "seed_a": a,
                    "seed_b": b,
                    "experiment": str(results.get("experiment", self.cfg.experiment)),
                    "model": str(results.get("model", self.cfg.model.name)),
                    "dataset": str(results.get("dataset", self.cfg.data.name)),
                    "task": str(results.get("task", self.cfg.data.task)),
                    "split": str(results.get("split", self.cfg.eval.split)),
                    # the whole pipeline config too, so sweep parameters can filter and group curves
                    "cfg": pipeline,
                }
                run = self._start(f"{method}_{a}-{b}", CURVE, config=config)
                run.define_metric("curve/lambda")
                run.define_metric("curve/*", step_metric="curve/lambda")
                columns = {
                    f"curve/{key}": pair.get(key) or [None] * len(pair["lambdas"])
                    for key in ("test_loss", "test_accuracy", "test_perplexity")
                }
                for i, lam in enumerate(pair["lambdas"]):
                    # λ and the values in one call: W&B plots a custom x-axis only against keys logged with it
                    row = {"curve/lambda": lam}
                    row.update({key: values[i] for key, values in columns.items() if values[i] is not None})
                    run.log(row)
                run.summary.update(
                    {key: pair[key] for key in ("barrier", "barrier_vs_mean") if pair.get(key) is not None}
                )
                runs.append(run)
        return runs

    def log_lines(self, key: str, xs: list[float], lines: dict[str, list[float | None]], xname: str) -> None:
        """With W&B, a line plot `key` in the open run: one line per entry of `lines` against `xs` (a line
        with a missing value is left out); nothing with csv/none."""
        if self.kind != "wandb" or self.run is None:
            return
        import wandb

        full = {name: ys for name, ys in lines.items() if all(y is not None for y in ys)}
        if full:
            plot = wandb.plot.line_series(
                xs=[list(xs)] * len(full), ys=list(full.values()), keys=list(full), xname=xname, title=key
            )
            self.run.log({key: plot})

    def log_image(self, key: str, path: Path) -> None:
        """With W&B, the PNG at `path` as image `key` in the open run; nothing with csv/none."""
        if self.kind == "wandb" and self.run is not None and Path(path).exists():
            import wandb

            self.run.log({key: wandb.Image(str(path))})

    def _fresh_version(self, name: str) -> str:
        """`name`, or `name.2`, `name.3`, ... where the folder already holds logs of an earlier run
        (Lightning's CSVLogger deletes the metrics.csv of a non-empty folder it writes to)."""
        logs = self.run_dir / "logs"
        version, n = name, 1
        while (logs / version).is_dir() and any((logs / version).iterdir()):
            n += 1
            version = f"{name}.{n}"
        return version

    def log_results(self, results: dict[str, Any]) -> Any | None:
        """One curve run per method and seed pair (`log_curves`), then the evaluate run: barrier
        curves (table and line plots), barriers and endpoint metrics in the summary, barrier.png, and
        results.json/barrier.csv/barrier.png as a "results" artifact.

        Called after those files were written into run_dir. Returns the artifact (None for csv/none).
        The evaluate run is the open run afterwards.
        """
        if self.kind != "wandb":
            return None
        import wandb

        self.log_curves(results)
        run = self._start(EVALUATE, EVALUATE)
        methods: dict[str, Any] = results.get("methods", {})
        names = list(methods)

        rows = []
        for name in names:
            m = methods[name]
            accuracy = m.get("test_accuracy") or [None] * len(m["lambdas"])
            for lam, loss, acc in zip(m["lambdas"], m["test_loss"], accuracy):
                rows.append([name, lam, "test", loss, acc])
        logged: dict[str, Any] = {
            "barrier_curves": wandb.Table(columns=["method", "lambda", "split", "loss", "accuracy"], data=rows)
        }
        for metric, key in (("loss", "test_loss"), ("accuracy", "test_accuracy")):
            # a method whose curve has no values (accuracy of a language model) gets no line
            lines = [n for n in names if methods[n].get(key) and all(v is not None for v in methods[n][key])]
            if lines:
                logged[f"barrier_curve/{metric}"] = wandb.plot.line_series(
                    xs=[list(methods[n]["lambdas"]) for n in lines],
                    ys=[list(methods[n][key]) for n in lines],
                    keys=lines,
                    title=f"test {metric} along the path",
                    xname="lambda",
                )
        png = self.run_dir / "barrier.png"
        if png.exists():
            logged["barrier_png"] = wandb.Image(str(png))
        run.log(logged)

        summary: dict[str, Any] = {}
        for name in names:
            for key in ("barrier", "barrier_vs_mean", "barrier_se"):
                if methods[name].get(key) is not None:
                    summary[f"{name}/{key}"] = methods[name][key]
        for e in results.get("endpoints", []):
            for key in ("test_loss", "test_accuracy"):
                if e.get(key) is not None:
                    summary[f"seed_{e['seed']}/{key}"] = e[key]
        run.summary.update(summary)

        artifact = wandb.Artifact(
            name=_artifact_name(f"results-{self.cfg.experiment}"),
            type="results",
            description=f"results of experiment {self.cfg.experiment}",
            metadata={"experiment": str(self.cfg.experiment), "methods": names},
        )
        files = [self.run_dir / f for f in RESULT_FILES if (self.run_dir / f).exists()]
        if not files:
            log.warning("no result files in %s: the results artifact is not logged", self.run_dir)
            return None
        for f in files:
            artifact.add_file(str(f), name=f.name)
        run.log_artifact(artifact)
        return artifact
