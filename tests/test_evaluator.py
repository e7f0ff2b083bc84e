"""The evaluator: paths equal naive copy-and-load evaluation, batches are cached, metrics reduce
over DDP ranks, autocast stays close to fp32, and bad splits or settings fail clearly."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from glmc.alignment import Alignment
from glmc.eval.evaluator import Evaluator, evaluate, evaluate_path
from glmc.models import canonical_forward, to_canonical
from glmc.models.canonical import circuit_params

from tiny_hf import tiny_gpt2, tiny_vit

LAMBDAS = [0.0, 0.3, 0.5, 1.0]


def images(n=40, seed=0, batch=16):
    g = torch.Generator().manual_seed(seed)
    data = TensorDataset(torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g))
    return DataLoader(data, batch_size=batch)


def tokens(n=12, seed=0, batch=5):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 97, (n, 11), generator=g)
    return DataLoader(TensorDataset(ids, ids), batch_size=batch)


def naive_mean(forward, loader, task):
    """Mean loss and accuracy, written out independently of the evaluator."""
    loss = correct = count = 0.0
    with torch.no_grad():
        for x, y in loader:
            logits = forward(x)
            if task == "causal_lm":
                logits, y = logits[:, :-1].flatten(0, 1), y[:, 1:].flatten()
            loss += F.cross_entropy(logits, y, reduction="sum").item()
            correct += (logits.argmax(-1) == y).sum().item()
            count += y.numel()
    return loss / count, correct / count


@pytest.mark.numeric
@pytest.mark.parametrize("build,loader,task", [(tiny_vit, images, "classification"), (tiny_gpt2, tokens, "causal_lm")])
def test_vanilla_path_equals_copy_and_load(build, loader, task):
    a, b = build(0), build(1)
    loader = loader()
    curve = evaluate_path(a, b, loader, LAMBDAS, task=task, progress=False)
    sa, sb = a.state_dict(), b.state_dict()
    for lam, loss, acc in zip(LAMBDAS, curve["loss"], curve["accuracy"]):
        model = copy.deepcopy(a)
        model.load_state_dict({k: lam * sa[k] + (1 - lam) * sb[k] if sa[k].is_floating_point() else sa[k] for k in sa})
        want = naive_mean(lambda x, m=model: m(x).logits, loader, task)
        assert loss == pytest.approx(want[0], rel=1e-5) and acc == pytest.approx(want[1]), lam


@pytest.mark.numeric
@pytest.mark.parametrize("circuits", [(), ("qk", "vo")])
def test_canonical_path_equals_explicit_interpolation(circuits):
    a, b = to_canonical(tiny_vit(0)), to_canonical(tiny_vit(1))
    loader = images()
    curve = Evaluator(loader, progress=False).path(Alignment(a, b, circuits=circuits), LAMBDAS)
    pa, pb = a.params(), b.params()
    if circuits:  # explicit QK and OV circuits, interpolated as matrices
        config, pa, pb = a.to_circuit().config, circuit_params(pa), circuit_params(pb)
    else:
        config = a.config
    for lam, loss in zip(LAMBDAS, curve["loss"]):
        params = {k: lam * pa[k] + (1 - lam) * pb[k] for k in pa}
        want = naive_mean(lambda x, p=params: canonical_forward(config, p, x), loader, "classification")
        assert loss == pytest.approx(want[0], rel=1e-5), lam


class CountingLoader:
    """A loader that counts how often it is iterated."""

    def __init__(self, loader):
        self.loader, self.passes = loader, 0

    def __iter__(self):
        self.passes += 1
        return iter(self.loader)


def test_batches_are_read_once_while_they_fit_the_cache():
    a, b = tiny_vit(0), tiny_vit(1)
    counting = CountingLoader(images())
    evaluator = Evaluator(counting, progress=False)
    cached = evaluator.path(Alignment(a, b), LAMBDAS)
    evaluator.evaluate(a)
    assert counting.passes == 1
    streaming = CountingLoader(images())
    uncached = Evaluator(streaming, cache_mb=0.001, progress=False).path(Alignment(a, b), LAMBDAS)
    assert streaming.passes == len(LAMBDAS)
    assert uncached == cached


@pytest.mark.numeric
def test_bf16_autocast_stays_close_to_fp32():
    model = to_canonical(tiny_vit(0))
    loss32, _ = evaluate(model, images(), precision="32")
    loss16, _ = evaluate(model, images(), precision="bf16")
    assert loss16 != loss32 and loss16 == pytest.approx(loss32, rel=0.05)


def test_bad_settings_and_empty_splits_fail_naming_them():
    with pytest.raises(ValueError, match="eval.precision"):
        Evaluator(images(), precision="fp8")
    empty = DataLoader(TensorDataset(torch.zeros(0, 1, 8, 8), torch.zeros(0, dtype=torch.long)), batch_size=4)
    with pytest.raises(ValueError, match="empty"):
        evaluate(tiny_vit(0), empty)
    with pytest.raises(ValueError, match="outside"):
        evaluate_path(tiny_vit(0), tiny_vit(1), images(), [1.5], progress=False)
    with pytest.raises(TypeError, match="both"):
        Evaluator(images(), progress=False).path(Alignment(tiny_vit(0), to_canonical(tiny_vit(1))), [0.5])


def _rank_metric(rank, world, init_file, queue):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        model = to_canonical(tiny_vit(0))
        queue.put((rank, Evaluator(images(n=50, batch=8), progress=False).evaluate(model)))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_ranks_share_the_split_and_reduce_to_the_whole_split_metric(tmp_path):
    import torch.multiprocessing as mp

    ctx = mp.get_context("fork")  # the ranks keep this process's imports (a spawned one re-imports for seconds)
    queue = ctx.Queue()
    procs = [ctx.Process(target=_rank_metric, args=(r, 2, tmp_path / "init", queue)) for r in range(2)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    single = Evaluator(images(n=50, batch=8), progress=False).evaluate(to_canonical(tiny_vit(0)))
    # 7 batches: rank 0 sees 4, rank 1 sees 3, and both report the metric of all 50 images
    for rank in (0, 1):
        assert results[rank][0] == pytest.approx(single[0], rel=1e-5)  # summed in another order
        assert results[rank][1] == pytest.approx(single[1])


@pytest.mark.gpu
@pytest.mark.parametrize("circuits", [(), ("qk", "vo")])
def test_path_on_cuda_matches_cpu(circuits):
    a, b = to_canonical(tiny_vit(0)), to_canonical(tiny_vit(1))
    alignment = Alignment(a, b, circuits=circuits)
    cpu = Evaluator(images(), progress=False).path(alignment, LAMBDAS)
    cuda = Evaluator(images(), device="cuda", progress=False).path(alignment, LAMBDAS)
    assert cuda["loss"] == pytest.approx(cpu["loss"], rel=1e-4)
    assert all(t.device.type == "cpu" for t in a.params().values())  # it moved copies, not the models


@pytest.mark.gpu
def test_pipeline_evaluates_on_the_trainers_gpu(tmp_path, tiny_overrides):
    from glmc.pipeline.run import run_pipeline

    from conftest import compose_config

    results = run_pipeline(compose_config(*tiny_overrides, "trainer=gpu"), tmp_path / "run")
    assert results["device"].startswith("cuda")
