"""Import layering: methods and evaluation never reach up into the pipeline that orchestrates them, and
no two parts of glmc import each other."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "glmc"
# neutral modules that matching, eval, merging and train share: they sit below all of them
NEUTRAL = ("alignment", "interpolation", "metrics", "schedule")
# part (subpackage or top-level module) -> parts of glmc it must not import
FORBIDDEN = {
    # matchers get training and evaluation through MatchContext.fit / .path_loss, filled from above
    "matching": {"pipeline", "eval", "train", "merging", "api"},
    "eval": {"pipeline", "matching", "merging", "api"},
    # merges build models and never score them: evaluating a merge is the pipeline's (it may use eval then)
    "merging": {"pipeline", "matching", "eval", "train", "api"},
    # train fits whatever module it is handed (matching's included) without importing it
    "train": {"pipeline", "matching", "merging", "api"},
    "symmetry": {"pipeline", "matching", "eval", "merging", "train", "api"},
    "models": {"pipeline", "matching", "eval", "merging", "train", "symmetry", "api"},
    **{name: {"pipeline", "matching", "eval", "merging", "train", "api"} for name in NEUTRAL},
}


def module_name(path: Path) -> str:
    parts = ("glmc", *path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def part(module: str) -> str:
    """The subpackage or top-level module a glmc module belongs to ("glmc" for the package root)."""
    return module.split(".")[1] if "." in module else "glmc"


def resolve(name: str) -> str | None:
    """The glmc module an imported dotted name lives in: the longest prefix that is a module, so
    `from glmc.matching.base import MatchContext` is glmc.matching.base and `from glmc import align`
    the package root."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in MODULES:
            return ".".join(parts[:n])
    return None


def imports_of(path: Path) -> list[tuple[str, int]]:
    """(glmc module, line) for every import in a file, at any depth: function-level ones and those
    under `if TYPE_CHECKING:` included (a part depends on what it names, even for types only)."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against this file's package
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        out += [(m, node.lineno) for m in map(resolve, names) if m is not None]
    return out


def glmc_imports(path: Path) -> set[str]:
    """The parts of glmc a module imports, at any depth (function-level imports included)."""
    return {part(m) for m, _ in imports_of(path)}


def part_graph() -> dict[str, dict[str, str]]:
    """part -> {part it imports: where (the first such import, as file:line -> module)}."""
    graph: dict[str, dict[str, str]] = {part(m): {} for m in MODULES}
    for module, path in MODULES.items():
        for target, line in imports_of(path):
            if part(target) != part(module):
                graph[part(module)].setdefault(part(target), f"{path.relative_to(SRC)}:{line} -> {target}")
    return graph


def cycles(graph: dict[str, dict[str, str]]) -> list[list[str]]:
    """The strongly connected parts of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def describe(graph: dict[str, dict[str, str]], found: list[list[str]]) -> str:
    return "\n".join(
        f"{' <-> '.join(c)}: " + "; ".join(graph[a][b] for a in c for b in c if b in graph[a]) for c in found
    )


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_lower_layers_do_not_import_upper_ones(package):
    modules = sorted((SRC / package).rglob("*.py")) if (SRC / package).is_dir() else [SRC / f"{package}.py"]
    assert modules and all(m.exists() for m in modules), f"glmc.{package} is gone: update FORBIDDEN"
    for module in modules:
        bad = glmc_imports(module) & FORBIDDEN[package]
        assert not bad, f"{module.relative_to(SRC)} imports glmc.{sorted(bad)}"


def test_the_check_sees_imports():
    assert glmc_imports(SRC / "pipeline" / "run.py") >= {"matching", "eval"}
    assert "config" in glmc_imports(SRC / "api.py")  # a function-level import (api._trainer)
    assert "api" in glmc_imports(SRC / "__init__.py")  # `from glmc.api import ...` from the root


def test_no_import_cycle_between_parts():
    graph = part_graph()
    found = cycles(graph)
    assert not found, "import cycles between parts of glmc:\n" + describe(graph, found)


def test_the_cycle_check_finds_cycles():
    graph = {"a": {"b": ""}, "b": {"c": ""}, "c": {"a": ""}, "d": {"a": ""}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b": ""}, "b": {}}) == []


def test_import_glmc_loads_no_training_or_model_library():
    """`import glmc` (and so every `glmc.*` import, spawned DDP ranks and sweep jobs included) stays
    light: Lightning, transformers, Hydra and W&B load where they are used."""
    heavy = ("lightning", "transformers", "hydra", "wandb")
    code = f"import sys, glmc; print(' '.join(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == ""
