"""Weight matching's host work that runs on one torch thread (glmc.threads.one_thread): the count inside and
after, nested and from several threads at once, the layers solved side by side, the decompositions; and
benchmarks/device_check.py's weight-matching parts."""

from __future__ import annotations

import sys
import threading

import pytest
import torch

from glmc.matching.engine import projections, warm_assignment
from glmc.matching.engine.assignment import assign_layers
from glmc.matching.engine.projections import decomposed, decomposing, polar_factor
from glmc.matching.engine.scales import best_scales
from glmc.threads import one_thread

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import device_check  # noqa: E402  (a script, importable once its folder is on the path)


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_one_thread_inside_restored_after_nested_and_from_threads(two_threads):
    with one_thread():
        assert torch.get_num_threads() == 1
        with one_thread():
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 1  # the outer section still runs
    assert torch.get_num_threads() == 2
    # sections that overlap in two threads, the first to start ending first: the count comes back once both end
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen = []

    def first():
        with one_thread():
            first_in.set()
            second_in.wait(5)
        first_out.set()

    def second():
        first_in.wait(5)
        with one_thread():
            second_in.set()
            first_out.wait(5)
            seen.append(torch.get_num_threads())

    workers = [threading.Thread(target=f) for f in (first, second)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(10)
    assert seen == [1] and torch.get_num_threads() == 2
    with pytest.raises(RuntimeError), one_thread():  # an error inside restores the count too
        raise RuntimeError("inside")
    assert torch.get_num_threads() == 2


def test_layers_side_by_side_each_on_one_thread_same_answers(two_threads):
    g = torch.Generator().manual_seed(0)
    similarities = [torch.randn(40, 40, generator=g) for _ in range(4)]
    counts = []

    def solve(layer):
        counts.append(torch.get_num_threads())
        return warm_assignment.fresh_assignment(similarities[layer])[0]

    side_by_side = assign_layers(solve, range(4), threads=2)
    assert counts == [1] * 4 and torch.get_num_threads() == 2
    one_by_one = assign_layers(solve, range(4), threads=1)
    assert counts[4:] == [2] * 4  # solved in this thread: torch's count as it was
    assert all(torch.equal(a.perm, b.perm) for a, b in zip(side_by_side, one_by_one))


def test_decompositions_on_one_host_thread(two_threads, monkeypatch):
    counts = []
    eigh = torch.linalg.eigh

    def counted(*args, **kwargs):
        counts.append(torch.get_num_threads())
        return eigh(*args, **kwargs)

    monkeypatch.setattr(torch.linalg, "eigh", counted)
    a = torch.randn(30, 30, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) + 6 * torch.eye(30)
    q, gram = polar_factor(a)
    assert gram and counts == [1] and torch.get_num_threads() == 2
    assert torch.allclose(q.T @ q, torch.eye(30, dtype=torch.float64), atol=1e-12)
    with decomposing(torch.zeros(2, device="meta")):  # not the host: the count stays
        assert torch.get_num_threads() == 2
    # wide ones keep torch's threads only while no other process takes a core
    monkeypatch.setattr(projections, "THREADED_FROM", 30)
    for free, inside in ((2, 2), (1, 1)):
        monkeypatch.setattr(projections, "free_threads", lambda free=free: free)
        with decomposing(a):
            assert torch.get_num_threads() == inside
        with decomposing(a[:, :29]):
            assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2


FLOOR_OUTPUT = """\
== llama-1.1b -- CUT to 4 of 22 layers (--layers)
  GEMM 5632x4097 @ 4097x5632, the faster of before and after: float32 51234.5 GFLOP/s, float64 49811.0 GFLOP/s
     seconds  products    assign     floor   ratio  assign share
       1.250     0.020     0.700     0.720   1.74x          56%
  of the rest: decompositions (eigh, SVD; not in the floor) 0.210 s per iteration
  peak memory above the two models: 3.10 GiB
"""


def test_weight_parts_alone_on_the_host_and_their_row(tmp_path, capsys):
    assert device_check.main(["--only", "weight", "--device", "cpu", "--layers", "1", "--dry-run"]) == 0
    commands = [line for line in capsys.readouterr().out.splitlines() if "weight_floor.py" in line]
    assert [c.split("--shapes ")[1] for c in commands] == ["gpt2-124m --layers 1", "llama-1.1b --layers 1"]
    assert all("--device cpu" in c for c in commands)
    full = device_check.plan(device_check.parse(["--tokenizer", "t", "--shakespeare", "s"]), tmp_path)
    weight = [p for p in full if p.name.startswith("weight, ")]
    assert [p.command[-2:] for p in weight] == [["--shapes", "gpt2-124m"], ["--layers", "4"]]
    assert all("cuda" in p.command and p.limit == device_check.LIMITS["weight"] for p in weight)
    assert full[-1].name == "shakespeare"  # the last part still gets what the others leave
    ((what, measured),) = device_check.weight_rows("1.1B Llama shape", FLOOR_OUTPUT)
    assert what == "weight matching, 1.1B Llama shape (4 of 22 layers)"
    assert measured.startswith("1.250 s / iteration, 1.74x its floor of 0.720 s") and "51234.5 GFLOP/s" in measured
    assert "56 %" in measured and "3.10 GiB above" in measured
    missing = device_check.weight_rows("GPT-2 124M", "Traceback")
    assert missing == [("weight matching, GPT-2 124M", "no table in the output")]
    only = device_check.parse(["--only", "weight", "--layers", "2"])
    part = device_check.weight_parts(only)[1]
    part.rows, part.status = device_check.weight_rows("1.1B Llama shape", FLOOR_OUTPUT), "ok"
    text = device_check.table([part], "NVIDIA H100 80GB HBM3", only, 42.0)
    assert text.startswith("Weight matching on NVIDIA H100 80GB HBM3 (`python benchmarks/device_check.py --only")
    assert "--device cuda --layers 2`, 42 s in all" in text and "| weight, 1.1B Llama shape | ok |" in text


def test_weight_parts_on_cuda_refused_without_one(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device_check.main(["--only", "weight"]) == 2
    printed = capsys.readouterr().out
    assert "no CUDA device" in printed and "--only weight --device cpu" in printed
    with pytest.raises(SystemExit):  # cpu only for the weight parts, which need no tokenizer or corpus
        device_check.main(["--device", "cpu", "--tokenizer", "t", "--shakespeare", "s"])
    assert "applies to the weight parts alone" in capsys.readouterr().err


def test_relaxation_on_one_thread_only_where_torch_would_split_it(two_threads, monkeypatch):
    counts = []
    inner = warm_assignment._relax

    def counted(*args):
        counts.append(torch.get_num_threads())
        return inner(*args)

    monkeypatch.setattr(warm_assignment, "_relax", counted)
    g = torch.Generator().manual_seed(2)
    for n in (12, 300):  # 12 x 12 arcs are below torch's grain, 256 rows of 300 above it
        s = torch.randn(n, n, generator=g)
        perm = warm_assignment.fresh_assignment(s)[0].perm
        assert warm_assignment.potentials(warm_assignment.arc_weights(s, perm)) is not None
    assert counts == [2, 1] and torch.get_num_threads() == 2


def _recording(monkeypatch, name: str) -> list[str]:
    """Replace torch.linalg.<name> by one that records the device of each call's input."""
    seen, original = [], getattr(torch.linalg, name)

    def recorded(a, **kwargs):
        seen.append(a.device.type)
        return original(a, **kwargs)

    monkeypatch.setattr(torch.linalg, name, recorded)
    return seen


def test_decomposed_on_the_host_is_the_decomposition_itself(monkeypatch):
    seen = _recording(monkeypatch, "svd")
    a = torch.randn(6, 40, 40, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    u, s, vh = decomposed(torch.linalg.svd, a)
    expected = torch.linalg.svd(a)
    for got, want in zip((u, s, vh), expected):
        assert torch.equal(got, want)
    assert decomposed(torch.linalg.svdvals, a).shape == (6, 40)
    assert seen[0] == "cpu"


def test_a_large_batch_of_narrow_host_matrices_is_split_between_free_cores(two_threads, monkeypatch):
    g = torch.Generator().manual_seed(4)
    a = torch.randn(3, 2 * projections.SPLIT_FROM, 12, 12, dtype=torch.float64, generator=g)
    whole = [torch.linalg.eigh(a), torch.linalg.svd(a), torch.linalg.eigvals(a)]
    threads, eigh = [], torch.linalg.eigh

    def seen(part, **kwargs):
        threads.append((threading.get_ident(), torch.get_num_threads(), len(part)))
        return eigh(part, **kwargs)

    monkeypatch.setattr(projections, "free_threads", lambda: 2)
    for fn, want in zip((seen, torch.linalg.svd, torch.linalg.eigvals), whole):
        got = decomposed(fn, a)
        for x, y in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            assert x.shape == y.shape and torch.equal(x, y)  # each matrix alone: the same floats
    # two parts, each decomposed with one torch thread (which pool worker runs a part is the pool's business)
    assert len(threads) == 2 and {n for _, n, _ in threads} == {1}
    assert all(t != threading.get_ident() for t, _, _ in threads)
    assert sum(size for _, _, size in threads) == a.shape[:2].numel() and torch.get_num_threads() == 2
    # another process on a core, a small batch, or inside a section already side by side: one call
    for free, batch, inside in ((1, a, False), (2, a[0, :4], False), (2, a, True)):
        threads.clear()
        monkeypatch.setattr(projections, "free_threads", lambda free=free: free)
        if inside:
            with one_thread():
                decomposed(seen, batch)
        else:
            decomposed(seen, batch)
        assert len(threads) == 1


@pytest.mark.gpu
def test_narrow_decompositions_of_cuda_tensors_run_on_the_host(monkeypatch):
    seen = _recording(monkeypatch, "svd")
    a = torch.randn(64, 48, 48, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    u, s, vh = decomposed(torch.linalg.svd, a.cuda())
    assert seen == ["cpu"] and u.is_cuda and s.is_cuda and vh.is_cuda
    torch.testing.assert_close((u @ torch.diag_embed(s) @ vh).cpu(), a, rtol=1e-10, atol=1e-10 * float(a.abs().max()))
    wide = torch.randn(projections.ON_HOST_BELOW, projections.ON_HOST_BELOW, device="cuda")
    decomposed(torch.linalg.svd, wide)
    assert seen == ["cpu", "cuda"]
    # the rescalings' quartics: a general eigensolver, which a device runs one matrix at a time
    roots = _recording(monkeypatch, "eigvals")
    moments = [torch.rand(4096, dtype=torch.float64, generator=torch.Generator().manual_seed(k)) for k in range(4)]
    on_card = best_scales(*(m.cuda() for m in moments))
    assert roots == ["cpu"] and on_card.is_cuda
    torch.testing.assert_close(on_card.cpu(), best_scales(*moments), rtol=1e-12, atol=0)


def test_polar_factors_of_a_batch_are_the_svds_the_ill_conditioned_ones_by_the_svd(monkeypatch):
    g = torch.Generator().manual_seed(4)
    a = torch.randn(5, 3, 24, 24, dtype=torch.float64, generator=g)
    a[1, 2, :, 0] = 1e-7 * a[1, 2, :, 1]  # columns nearly dependent: its Gram matrix is ill-conditioned
    u, _, vh = torch.linalg.svd(a)
    seen = _recording(monkeypatch, "svd")
    q = projections.polar_factors(a)
    torch.testing.assert_close(q, u @ vh, rtol=0, atol=1e-9)
    assert seen == ["cpu"]  # one SVD, of the one matrix the Gram matrix does not serve
    nuclear = (q * a).sum((-1, -2))
    torch.testing.assert_close(nuclear, torch.linalg.svdvals(a).sum(-1), rtol=1e-12, atol=0)
