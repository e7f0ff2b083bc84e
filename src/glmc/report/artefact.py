"""What a reproducible artefact (a table or figure of paper 001) is: the runs that feed it and the
function that turns their folders into files.

`experiments/reproduce.py <name>` runs every step of the artefact (`python run.py [-m] ...` with the
run or sweep folder fixed to `<root>/<step label>`), skips a step whose folder already holds
finished results, writes `<out>/times.json`, then calls `make(root, out)`.

Conventions for `make`: read a single run with `glmc.report.results.run_results(root / label)` and
a grid (`multirun=True`, job folders `0/`, `1/`, ...) with `grid_results`; write the files into
`out` and finish with `glmc.report.section.write_section(ARTEFACT, out, body)`, which adds the
title, the command and the per-step times around `body` (tables, `![...](file.png)` links).
A label shared by two artefacts names one set of runs: both must use the same Step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

# --tiny for a text model: one layer of width 32 on windows of 32 tokens (after debug=fast, which shrinks the
# experiment's own model to width 16)
TINY_TEXT_MODEL = (
    "model.num_layers=1",
    "model.hidden_size=32",
    "model.num_heads=2",
    "model.mlp_size=64",
    "model.max_positions=32",
    "data.seq_len=32",
)


@dataclass(frozen=True)
class Step:
    """One `run.py` invocation: a single run, or a Hydra multirun grid when `multirun` is set."""

    label: str  # the folder under the artefact's root that holds this step's run(s)
    overrides: tuple[str, ...]  # run.py overrides, e.g. ("experiment=table2_digits",)
    multirun: bool = False
    tiny: tuple[str, ...] = ()  # added by --tiny (after `debug=fast`) so the step takes seconds


@dataclass(frozen=True)
class Artefact:
    name: str
    title: str  # e.g. "Table 2: barrier per method and task"
    steps: tuple[Step, ...]
    # (root holding one folder per step label, output folder) -> the files written (tables, PNGs, section.md)
    make: Callable[[Path, Path], list[Path]] = field(compare=False)
    flags: str = ""  # reproduce.py's switch that selects this variant of the artefact (e.g. "--paper-size")
