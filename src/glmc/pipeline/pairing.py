"""Which endpoints a run aligns with which (`pairing`), and what the seeds or folders must be for it."""

from __future__ import annotations

from collections import Counter

from glmc.ranges import SEED_LIMIT


def seed_pairs(seeds: list[int], pairing: str) -> list[tuple[int, int]]:
    """Index pairs (A, B). `disjoint` gives independent pairs (0,1),(2,3)... for a standard error."""
    n = len(seeds)
    if n < 2:
        raise ValueError(f"seeds={seeds}: at least two endpoints are needed")
    if pairing == "disjoint":
        if n % 2:
            raise ValueError(f"seeds={seeds}: pairing=disjoint needs an even number of seeds")
        return [(i, i + 1) for i in range(0, n, 2)]
    if pairing == "all":
        return [(i, j) for i in range(n) for j in range(i + 1, n)]
    if pairing == "first":
        return [(0, j) for j in range(1, n)]
    if pairing == "universe":  # no pairs: every endpoint at once (glmc.pipeline.multi)
        return []
    raise ValueError(f"pairing={pairing!r} is not one of disjoint, all, first, universe")


def seed_problems(seeds: list[int], pairing: str) -> list[str]:
    """Seeds repeated, negative or too large, and seeds the pairing cannot pair."""
    bad = (
        (
            sorted(s for s, n in Counter(seeds).items() if n > 1),
            "appears more than once; a pair of one seed is one model twice, so give every endpoint its own seed "
            "(e.g. seeds=[0,1])",
        ),
        ([s for s in seeds if s < 0], "is negative; use seeds >= 0"),
        ([s for s in seeds if s >= SEED_LIMIT], "is too large; use seeds in [0, 2^32)"),
    )
    problems = [f"seeds={seeds}: seed {found[0]} {fix}" for found, fix in bad if found]
    try:
        seed_pairs(seeds, pairing)
    except ValueError as err:
        return problems + [str(err)]
    if pairing == "universe" and len(seeds) < 3:
        problems.append(f"seeds={seeds}: pairing=universe aligns three or more models; give at least 3 seeds")
    return problems


def folder_count_problems(n: int, pairing: str) -> list[str]:
    """`n` model folders (endpoints=pretrained) that the pairing cannot pair."""
    if pairing == "disjoint" and n % 2:
        return [
            f"endpoints.paths holds {n} folders: pairing=disjoint pairs them (0, 1), (2, 3), ...; give an even "
            "number of folders, or pairing=all (every pair) or pairing=first (the first against each other)"
        ]
    if pairing == "universe" and n < 3:
        return [f"endpoints.paths holds {n} folders: pairing=universe aligns three or more models; give at least 3"]
    return []
