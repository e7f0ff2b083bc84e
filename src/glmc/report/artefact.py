"""A reproducible artefact (a table or figure): the runs that feed it (`experiments/reproduce.py` runs each
step into `<root>/<step label>`) and `make(root, out)`, which reads them (glmc.report.results) and writes its
files and section.md (glmc.report.section). A label shared by two artefacts must name the same Step."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

# --tiny for a text model: one layer of width 32 on windows of 32 tokens
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
