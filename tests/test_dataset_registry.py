"""The dataset registry (glmc.datasets) is the one place that names a dataset: every entry has its
conf/data YAML and every YAML an entry, and no module outside it and glmc/data names one."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from glmc.choices import Dataset
from glmc.datasets import DATASETS, Lazy, dataset

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "glmc"
DATA_CONF = ROOT / "conf" / "data"
ALLOWED = {SRC / "datasets.py"}  # the registry itself


def _yamls() -> dict[str, dict]:
    return {p.stem: OmegaConf.to_container(OmegaConf.load(p)) for p in sorted(DATA_CONF.glob("*.yaml"))}


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring nodes of the module, its classes and functions (prose, not code)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _literal_names(path: Path, names: set[str]) -> list[str]:
    """`path:line: literal` for every string literal (docstrings aside) that is a dataset's name, or
    says data=<name> / data.name=<name> in a message."""
    tree = ast.parse(path.read_text(), str(path))
    prose = _docstrings(tree)
    pattern = re.compile(rf"\bdata(\.name)?=({'|'.join(map(re.escape, names))})\b")
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            if node.value in names or pattern.search(node.value):
                hits.append(f"{path}:{node.lineno}: {node.value!r}")
    return hits


def test_no_module_outside_data_names_a_dataset():
    names = set(DATASETS) | set(_yamls())  # the entries and the conf/data options (pydoc_mlm)
    files = [p for p in SRC.rglob("*.py") if (SRC / "data") not in p.parents and p not in ALLOWED]
    hits = [hit for path in files for hit in _literal_names(path, names)]
    assert not hits, "ask glmc.datasets instead of naming a dataset:\n" + "\n".join(hits)


def test_the_scan_finds_a_named_dataset(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text('"""Docstrings may say data=digits."""\nKIND = "digits"\nHINT = f"use data=pydoc_mlm"\n')
    hits = _literal_names(planted, {"digits", "pydoc_mlm"})
    assert [h.split(": ", 1)[1] for h in hits] == ["'digits'", "'use data=pydoc_mlm'"]


def test_every_entry_has_a_yaml_and_every_yaml_an_entry():
    yamls = _yamls()
    named = {option: conf.get("name") for option, conf in yamls.items()}
    unknown = {option: name for option, name in named.items() if name not in DATASETS}
    assert not unknown, f"conf/data options naming no registry entry: {unknown}"
    for name, info in DATASETS.items():
        assert name in yamls and named[name] == name, f"{name}: add conf/data/{name}.yaml with `name: {name}`"
        assert yamls[name].get("task", "classification") in info.tasks, f"conf/data/{name}.yaml sets another task"
        for task, option in info.examples.items():
            assert option in yamls, f"{name}: its example for {task} is conf/data/{option}.yaml, which is absent"
            assert (named[option], yamls[option].get("task")) == (name, task), f"conf/data/{option}.yaml"


def test_entries_are_complete():
    assert sorted(Dataset) == sorted(DATASETS)
    for name, info in DATASETS.items():
        assert info.name == name and info.modality in ("images", "text") and info.tasks
        assert isinstance(info.loader, Lazy) and callable(info.loader.get()), name
        if info.modality == "images":
            assert info.image_size and info.channels and info.classes, name
    topics = [d for d in DATASETS.values() if d.labels is not None]
    assert topics and all(d.num_classes() == len(d.labels.get()) >= 2 for d in topics)


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="is not a known dataset .*digits"):
        dataset("mnist")


def test_the_schemas_enum_lists_the_registry():
    from glmc.choices import Dataset
    from glmc.datasets import dataset_names

    assert [d.value for d in Dataset] == dataset_names()
