"""section.md of an artefact: its title, the command that regenerates it, its tables and figures, and what
its runs cost (times.json); `experiments/reproduce.py --report` joins the sections into REPORT.md."""

from __future__ import annotations

import json
import os
from pathlib import Path

from glmc.report.artefact import Artefact
from glmc.report.tables import write_csv
from glmc.safe_files import atomic_write_text

TIMES = "times.json"  # written into the output folder by experiments/reproduce.py before `make`


def command(name: str, flags: str = "") -> str:
    return f"python experiments/reproduce.py {name}" + (f" {flags}" if flags else "")


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "time not recorded"
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def cost_line(artefact: Artefact, out: Path) -> str:
    """One line per step: how long its runs took (possibly for another artefact), on how many cores."""
    path = Path(out) / TIMES
    times = json.loads(path.read_text()) if path.is_file() else {}
    steps = times.get("steps", {})
    cores = times.get("cores") or os.cpu_count()
    parts = []
    for step in artefact.steps:
        entry = steps.get(step.label, {})
        kind = f"grid of {entry['jobs']} jobs" if entry.get("jobs") else "single run"
        parts.append(f"`{step.label}` ({kind}): {_duration(entry.get('seconds'))}")
    lines = [f"Runs, on a machine with {cores} CPU cores: " + "; ".join(parts) + "."]
    if times.get("tiny"):
        lines.append("Made with `--tiny` (debug-sized models and runs): the numbers only show that the pipeline works.")
    return "\n\n".join(lines)


def write_section(artefact: Artefact, out: Path, body: str) -> Path:
    """section.md in `out`; `body` holds the tables and `![...](file.png)` links relative to `out`."""
    text = "\n\n".join(
        [f"## {artefact.title}", f"`{command(artefact.name, artefact.flags)}`", body.strip(), cost_line(artefact, out)]
    )
    return atomic_write_text(Path(out) / "section.md", text + "\n")


def write_table_section(
    artefact: Artefact, out: Path, table: str, notes: str, header, rows, tex: str | None = None
) -> list[Path]:
    """<name>.md (`table`), <name>.tex (`tex`, where given), <name>.csv (`header`, `rows`) and section.md: the
    table, `notes` and links to the files."""
    name, out = artefact.name, Path(out)
    texts = [(".md", table), *([(".tex", tex)] if tex else [])]
    files = [atomic_write_text(out / f"{name}{suffix}", text + "\n") for suffix, text in texts]
    files.append(write_csv(out / f"{name}.csv", header, rows))
    links = ", ".join(f"[{f.name}]({f.name})" for f in files)
    return [*files, write_section(artefact, out, f"{table}\n\n{notes}\n\nFiles: {links}.")]
