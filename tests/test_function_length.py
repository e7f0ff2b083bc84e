"""No function in src/glmc is longer than 80 lines (DESIGN: a fast path is a named step beside the plain one)."""

from __future__ import annotations

import ast

from conftest import ROOT

LIMIT = 80


def test_no_function_in_the_package_is_longer_than_80_lines():
    long = []
    for path in sorted((ROOT / "src" / "glmc").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > LIMIT:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "functions over 80 lines:\n  " + "\n  ".join(long)
