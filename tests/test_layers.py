"""Import layering: methods and evaluation never reach up into the pipeline that orchestrates them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "glmc"
# package -> packages of glmc it must not import
FORBIDDEN = {
    "matching": {"pipeline", "api"},
    "eval": {"pipeline", "api"},
    "symmetry": {"pipeline", "matching", "eval", "api"},
    "models": {"pipeline", "matching", "eval", "api"},
}


def glmc_imports(path: Path) -> set[str]:
    """The glmc subpackages a module imports, at any depth (function-level imports included)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        out |= {n.split(".")[1] for n in names if n.startswith("glmc.") and n.count(".") >= 1}
    return out


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_lower_layers_do_not_import_upper_ones(package):
    for module in sorted((SRC / package).rglob("*.py")):
        bad = glmc_imports(module) & FORBIDDEN[package]
        assert not bad, f"{module.relative_to(SRC)} imports glmc.{sorted(bad)}"


def test_the_check_sees_imports():
    assert glmc_imports(SRC / "pipeline" / "run.py") >= {"matching", "eval"}
