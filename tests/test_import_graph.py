"""src/glmc imports in one direction: no circle among its modules, counting imports inside functions and
under TYPE_CHECKING, and no module importing another module's private name. Read from the source (ast);
nothing is imported."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

from test_layers import cycles

SRC = Path(__file__).resolve().parents[1] / "src"


def read_sources(root: Path = SRC) -> dict[str, tuple[str, bool]]:
    """Module name -> (its source, whether it is a package's __init__) for every module under `root`."""
    sources = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        package = parts[-1] == "__init__"
        sources[".".join(parts[:-1] if package else parts)] = (path.read_text(encoding="utf-8"), package)
    return sources


def import_edges(sources: dict[str, tuple[str, bool]]) -> tuple[dict[str, set[str]], list[str]]:
    """Which modules each module imports (anywhere in it), and every `from m import _name` of a private
    name as "importer: m._name". `from package import name` imports the submodule where one is so named;
    relative imports are resolved against the importer's package."""
    graph: dict[str, set[str]] = {name: set() for name in sources}
    private = []
    for name, (source, package) in sources.items():
        here = name.split(".") if package else name.split(".")[:-1]
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                graph[name] |= {a.name for a in node.names if a.name in sources}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
                for alias in node.names:
                    if f"{base}.{alias.name}" in sources:
                        graph[name].add(f"{base}.{alias.name}")
                    elif base in sources:
                        graph[name].add(base)
                        if alias.name.startswith("_") and not alias.name.startswith("__"):
                            private.append(f"{name}: {base}.{alias.name}")
        graph[name].discard(name)
    return graph, private


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of `graph`, each sorted (Tarjan's strongly connected parts, as tests/test_layers.py
    finds them between parts)."""
    return cycles({v: {w: "" for w in sorted(ws)} for v, ws in graph.items()})


@cache
def glmc_imports() -> tuple[dict[str, set[str]], list[str]]:
    return import_edges(read_sources())


def test_no_module_of_glmc_is_in_an_import_circle():
    graph, _ = glmc_imports()
    assert "glmc.pipeline.endpoints" in graph["glmc.pipeline.run"]  # the sources were read
    assert circles(graph) == [], "modules that import each other: move what they share to where it belongs"


def test_no_module_of_glmc_imports_a_private_name():
    _, private = glmc_imports()
    assert private == [], "make the name public in the module where it belongs, or move it there"


def test_the_checks_find_function_level_relative_and_submodule_imports():
    sources = {
        "p": ("", True),
        "p.a": ("from . import b\n", False),  # the submodule b, not the package
        "p.b": ("def f():\n    from p.c import helper\n", False),
        "p.c": ("import p.a\nfrom .d import _hidden\n", False),
        "p.d": ("from p import a\n", False),
        "p.e": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p.d import Name\n", False),
    }
    graph, private = import_edges(sources)
    assert graph["p.a"] == {"p.b"} and graph["p.c"] == {"p.a", "p.d"} and graph["p.e"] == {"p.d"}
    assert circles(graph) == [["p.a", "p.b", "p.c", "p.d"]]
    assert private == ["p.c: p.d._hidden"]
    assert circles({"x": {"y"}, "y": set()}) == []
