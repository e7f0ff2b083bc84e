"""Every reproducible artefact by name; each module `glmc.report.<name>` defines `ARTEFACT`."""

from __future__ import annotations

from importlib import import_module

from glmc.report.artefact import Artefact

NAMES = (
    "table2",
    "fig3",
    "fig3c",
    "fig4",
    "fig5",
    "fig7",
    "fig8",
    "fig9",
    "bert_mlm",
    "roberta_finetune",
    "llama_text",
)


def load(name: str) -> Artefact:
    """One artefact, importing only its own module, so a missing or broken one stops no other."""
    if name not in NAMES:
        raise KeyError(f"unknown artefact {name!r}: choose from {', '.join(NAMES)}")
    artefact = import_module(f"glmc.report.{name}").ARTEFACT
    if artefact.name != name:
        raise ValueError(f"glmc.report.{name}.ARTEFACT is named {artefact.name!r}")
    return artefact


def artefacts() -> dict[str, Artefact]:
    return {name: load(name) for name in NAMES}
