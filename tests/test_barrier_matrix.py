"""N x N barrier matrices: symmetric with a zero diagonal, each cell the barrier of its pair (pairing=all: B
aligned to A, mirrored; pairing=universe: the universe-aligned models), their CSVs read back as written."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from glmc.alignment import Alignment
from glmc.eval.barrier import barrier, lambda_grid
from glmc.eval.evaluator import Evaluator
from glmc.pipeline.matrix import barrier_matrices, barrier_matrix, matrix_record, read_matrix_csv, write_matrices

from conftest import compose_config
from tiny_hf import tiny_vit

PAIRS = [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]


class Labelled:
    """What barrier_matrices reads of an endpoint: its label."""

    def __init__(self, label: str):
        self.label = label


def test_the_matrix_is_symmetric_with_a_zero_diagonal_and_each_cell_its_pair():
    barriers = {pair: 0.1 * (k + 1) for k, pair in enumerate(PAIRS)}
    grid = barrier_matrix(4, barriers)
    assert [grid[i][i] for i in range(4)] == [0.0] * 4
    assert all(grid[i][j] == grid[j][i] == barriers[(i, j)] for i, j in PAIRS)
    record = matrix_record(["a", "b", "c", "d"], barriers)
    values = [0.1 * (k + 1) for k in range(6)]
    mean = sum(values) / 6
    se = math.sqrt(sum((v - mean) ** 2 for v in values) / 5 / 6)
    assert record["mean"] == pytest.approx(mean) and record["se"] == pytest.approx(se) and record["pairs"] == 6
    with pytest.raises(ValueError, match=r"no barrier for the pair \(2, 3\)"):
        barrier_matrix(4, {p: 0.0 for p in PAIRS[:-1]})


def test_pairing_all_and_universe_give_one_matrix_per_method_and_other_pairings_none():
    endpoints = [Labelled(s) for s in ("7", "8", "9")]
    pairs = [(0, 1), (0, 2), (1, 2)]
    methods = {"vanilla": {"pairs": [{"barrier": 0.3}, {"barrier": 0.2}, {"barrier": 0.1}]}}
    cfg = compose_config()
    cfg.pairing = "all"
    matrices = barrier_matrices(cfg, endpoints, pairs, methods, None)
    assert matrices["pairwise"]["vanilla"]["barriers"] == [[0.0, 0.3, 0.2], [0.3, 0.0, 0.1], [0.2, 0.1, 0.0]]
    assert matrices["pairwise"]["vanilla"]["labels"] == ["7", "8", "9"]
    multi = {"weight": {"pairwise_barriers": {"7-8": 0.05, "7-9": 0.04, "8-9": 0.03}}}
    assert barrier_matrices(cfg, endpoints[:2], pairs[:1], methods, None) == {}  # two endpoints: one pair
    cfg.pairing = "universe"
    universe = barrier_matrices(cfg, endpoints, [], {}, multi)
    assert set(universe) == {"universe"}
    assert universe["universe"]["weight"]["barriers"][2][1] == 0.03
    cfg.pairing = "first"
    assert barrier_matrices(cfg, endpoints, pairs[:2], {}, None) == {}


def test_csv_files_read_back_as_written_beside_one_heatmap(tmp_path):
    third = 1 / 3  # a value whose decimal form must round-trip exactly
    record = matrix_record(["s0", "s1", "s2"], {(0, 1): third, (0, 2): 0.5, (1, 2): 1e-9})
    files = write_matrices({"pairwise": {"weight": record}, "universe": {"weight": record}}, tmp_path, "t")
    assert sorted(f.name for f in files) == ["matrix.png", "matrix_universe_weight.csv", "matrix_weight.csv"]
    assert (tmp_path / "matrix.png").stat().st_size > 0
    labels, grid = read_matrix_csv(tmp_path / "matrix_weight.csv")
    assert labels == ["s0", "s1", "s2"] and grid == record["barriers"]


def test_a_model_has_no_barrier_with_itself_and_the_vanilla_barrier_does_not_depend_on_the_order():
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(32, 1, 8, 8, generator=g), torch.randint(0, 10, (32,), generator=g))
    evaluator = Evaluator(DataLoader(data, batch_size=16), progress=False)
    a, b, lambdas = tiny_vit(0), tiny_vit(1), lambda_grid(5)
    curve = lambda x, y: evaluator.path(Alignment(x, y), lambdas)["loss"]  # noqa: E731
    assert barrier(lambdas, curve(a, a)) == pytest.approx(0.0, abs=1e-6)
    forth, back = curve(a, b), curve(b, a)
    assert forth == pytest.approx(back[::-1], abs=1e-6) and forth[0] != pytest.approx(forth[-1], abs=1e-3)
    assert barrier(lambdas, forth) == pytest.approx(barrier(lambdas, back), abs=1e-6)
