"""No module in src/glmc grows past MAX_LINES: a concept that needs more is split into its parts."""

from __future__ import annotations

from pathlib import Path

import glmc

MAX_LINES = 600
PACKAGE = Path(glmc.__file__).parent


def oversized(root: Path, limit: int) -> dict[str, int]:
    """Line counts of the modules under `root` longer than `limit`, by path relative to `root`."""
    counts = {str(p.relative_to(root)): len(p.read_text().splitlines()) for p in sorted(root.rglob("*.py"))}
    return {path: n for path, n in counts.items() if n > limit}


def test_no_module_over_the_limit():
    offenders = oversized(PACKAGE, MAX_LINES)
    assert not offenders, f"modules over {MAX_LINES} lines (split them by concept): {offenders}"


def test_the_check_names_an_oversized_module(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "long.py").write_text("x = 1\n" * 4)
    (tmp_path / "short.py").write_text("x = 1\n" * 3)
    assert oversized(tmp_path, 3) == {"sub/long.py": 4}
