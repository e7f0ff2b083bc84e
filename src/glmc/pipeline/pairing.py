"""Which endpoints a run aligns with which: `pairing=disjoint|all|first|universe` over the seeds (or the
model folders of endpoints=pretrained), as index pairs (A, B). The config checks (glmc.pipeline.validate,
glmc.pipeline.folder_fit) and the run (glmc.pipeline.run) read the same pairs."""

from __future__ import annotations


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
