"""Failed jobs of a multirun, told when they fail and counted when the sweep ends.

A job that fails writes FAILED_FILE into its own folder (its overrides and the message) and prints one
line at once, so a long sweep does not hide its failures until the end; a job that later succeeds in
the same folder removes it. `SweepReport` (a Hydra callback, conf/config.yaml) lists the failed jobs
after the last one and exits with status 1. experiments/summarize.py lists them under its table.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

FAILED_FILE = "failed.json"
# failed jobs of this process's sweep whose folder another run holds: listed at the end, nothing written there
NOT_WRITTEN: list[dict[str, Any]] = []


def record_failed_job(job_dir: Path, job_num: int, overrides: list[str], message: str, write: bool = True) -> None:
    """Write FAILED_FILE into `job_dir` (`write=False`: the folder is another run's, keep the record here)
    and say on stderr, now, which job failed and why."""
    job_dir = Path(job_dir)
    shown = " ".join(overrides) or "(no overrides)"
    print(f"Error: job {job_num} ({shown}) failed: {message}", file=sys.stderr, flush=True)
    record = {"job": job_num, "overrides": list(overrides), "message": message}
    if not write:
        NOT_WRITTEN.append({**record, "folder": str(job_dir)})
        return
    try:
        job_dir.mkdir(parents=True, exist_ok=True)
        (job_dir / FAILED_FILE).write_text(json.dumps(record, indent=1) + "\n")
    except OSError:
        pass  # the line above has told it; a folder that cannot be written must not hide the first error


def clear_failed_job(job_dir: Path) -> None:
    """A job that finished leaves no record of an earlier failure in its folder."""
    (Path(job_dir) / FAILED_FILE).unlink(missing_ok=True)


def failed_jobs(sweep_dir: Path) -> list[dict[str, Any]]:
    """The FAILED_FILE records of the job folders directly below `sweep_dir`, in job order; each also
    names its folder."""
    found = []
    for path in Path(sweep_dir).glob(f"*/{FAILED_FILE}"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            record = {"message": f"{path} could not be read"}
        if not isinstance(record, dict):
            record = {"message": f"{path} holds no record"}
        found.append({**record, "folder": str(path.parent)})
    return sorted(found, key=_job_order)


def _job_order(record: dict[str, Any]) -> tuple[int, str]:
    return record.get("job") if isinstance(record.get("job"), int) else 1 << 30, record["folder"]


def describe_failures(failures: list[dict[str, Any]], jobs: int | None = None) -> str:
    """One line per failed job under a count: `job N (overrides): message`."""
    of = f" of {jobs}" if jobs else ""
    lines = [f"{len(failures)}{of} jobs failed:"]
    for f in failures:
        shown = " ".join(f.get("overrides") or []) or "(no overrides)"
        lines.append(f"  job {f.get('job', '?')} ({shown}): {f.get('message', '')}  [{f['folder']}]")
    return "\n".join(lines)


class SweepReport(Callback):
    """After the last job of a multirun: list the failed jobs on stderr and exit with status 1."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        NOT_WRITTEN.clear()

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        failures = sorted(failed_jobs(Path(str(config.hydra.sweep.dir))) + NOT_WRITTEN, key=_job_order)
        if failures:
            print(describe_failures(failures), file=sys.stderr, flush=True)
            raise SystemExit(1)
