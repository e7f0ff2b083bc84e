"""What keeps a real-size run within its bounds: the logit deviation compared a chunk at a time (never the
logits again in float64), progress lines from weight matching's slow iterations and from a folder's load."""

from __future__ import annotations

import logging
import os
import weakref

import torch

from glmc import host_memory
from glmc.alignment import Alignment
from glmc.matching import weight
from glmc.models import canonical, to_canonical
from glmc.pipeline.hf_folders import load_model, read_folder

from tiny_hf import tiny_gpt_neox


def whole(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max()).item()


def test_the_deviation_in_chunks_is_the_whole_tensors_bit_for_bit(monkeypatch):
    g = torch.Generator().manual_seed(0)
    b = torch.randn(3, 5, 11, generator=g)
    a = b + 1e-3 * torch.randn(3, 5, 11, generator=g)
    a[2, 4, 10] += 0.5  # the worst element in the last, short chunk
    expected = whole(a, b)
    monkeypatch.setattr(canonical, "DEVIATION_CHUNK", 7)  # 165 elements: 24 chunks
    assert canonical.relative_deviation(a, b) == expected
    a[0, 0, 0] = float("nan")
    assert torch.isnan(torch.tensor(canonical.relative_deviation(a, b)))
    # shapes that broadcast are compared as a whole, as before
    assert canonical.relative_deviation(b[:1] + 1, b) == whole(b[:1] + 1, b)


def test_weight_matching_writes_a_line_per_slow_iteration(monkeypatch, caplog):
    a, b = to_canonical(tiny_gpt_neox(seed=0)), to_canonical(tiny_gpt_neox(seed=1))
    with caplog.at_level(logging.INFO, logger="glmc.matching.weight"):
        weight.weight_matching(a, b, max_iter=3, tol=-float("inf"))
    assert not caplog.messages  # iterations of tiny models write no line
    monkeypatch.setattr(weight, "PROGRESS_EVERY_S", 0.0)  # every iteration as slow as a large model's
    with caplog.at_level(logging.INFO, logger="glmc.matching.weight"):
        _, diagnostics = weight.weight_matching(a, b, max_iter=3, tol=-float("inf"))
    lines = [m for m in caplog.messages if m.startswith("weight matching: iteration")]
    assert [line.split(",")[0] for line in lines] == [f"weight matching: iteration {i} of at most 3" for i in (1, 2, 3)]
    assert f"distance {diagnostics['objective'][-1]:.6f}" in lines[-1]
    assert caplog.messages[-1].startswith("weight matching: done after 3 iteration(s), distance ")


def test_a_large_search_writes_a_line_per_slow_layer_too(monkeypatch, caplog):
    a, b = to_canonical(tiny_gpt_neox(seed=0)), to_canonical(tiny_gpt_neox(seed=1))
    monkeypatch.setattr(weight, "PROGRESS_EVERY_S", 0.0)  # every layer as slow as a large model's
    with caplog.at_level(logging.INFO, logger="glmc.matching.weight"):
        weight.weight_matching(a, b, max_iter=2, tol=-float("inf"), layerwise=True)
    layers = a.num_layers
    lines = [m.rsplit(",", 1)[0] for m in caplog.messages if "layers" in m]
    runs = len(lines) // (2 * layers)  # each run of layer steps in an iteration reports every layer
    assert runs >= 1 and len(lines) == 2 * runs * layers
    for it in (1, 2):
        expected = [
            f"weight matching: iteration {it} of at most 2, {k} of {layers} layers" for k in range(1, layers + 1)
        ]
        assert [x for x in lines if f"iteration {it} " in x] == runs * expected


def test_loading_a_folder_writes_a_line_naming_it(tmp_path, caplog):
    tiny_gpt_neox().save_pretrained(tmp_path / "a")
    folder = read_folder(str(tmp_path / "a"), 0, "causal_lm")
    with caplog.at_level(logging.INFO, logger="glmc.pipeline.hf_folders"):
        load_model(folder)
    assert f"endpoints.paths[0]={tmp_path / 'a'}: loading its GPTNeoXForCausalLM weights" in caplog.messages


def test_large_logits_are_compared_in_chunks_with_the_same_result():
    size = canonical.DEVIATION_CHUNK + 5  # two chunks at the module's own size
    g = torch.Generator().manual_seed(1)
    b = torch.randn(size, generator=g)
    a = b + 1e-4 * torch.randn(size, generator=g)
    assert canonical.relative_deviation(a, b) == whole(a, b)


def tiny_pair():
    return to_canonical(tiny_gpt_neox(seed=0)), to_canonical(tiny_gpt_neox(seed=1))


def batches(count: int = 3):
    g = torch.Generator().manual_seed(2)
    draw = lambda: torch.randint(0, 53, (2, 8), generator=g)  # noqa: E731
    return [(draw(), draw()) for _ in range(count)]


def test_a_path_frees_each_points_parameters_before_building_the_next(monkeypatch):
    from glmc.eval import evaluator

    built = []

    def merge(*args, **kwargs):
        # the previous point's interpolated tensors are gone when the next point's are built
        assert all(ref() is None for ref in built), "two points' parameters held at once"
        params = evaluator_merge(*args, **kwargs)
        built.append(weakref.ref(params["embed.tokens"]))
        return params

    evaluator_merge = evaluator.merge_params
    monkeypatch.setattr(evaluator, "merge_params", merge)
    a, b = tiny_pair()
    curve = evaluator.Evaluator(batches(), "causal_lm", progress=False).path(Alignment(a, b), [0.25, 0.5, 0.75])
    assert len(built) == 3 and len(curve["loss"]) == 3


def test_each_batch_s_logits_are_freed_before_the_next_forward(monkeypatch):
    from glmc.eval import evaluator

    made = []

    def forward(*args, **kwargs):
        assert all(ref() is None for ref in made), "two batches' logits held at once"
        logits = evaluator_forward(*args, **kwargs)
        made.append(weakref.ref(logits))
        return logits

    evaluator_forward = evaluator.canonical_forward
    monkeypatch.setattr(evaluator, "canonical_forward", forward)
    a, _ = tiny_pair()
    loss, _ = evaluator.Evaluator(batches(), "causal_lm", progress=False).evaluate(a)
    assert len(made) == 3 and loss > 0


def resident() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_freed_heap_pages_are_handed_back_to_the_system():
    mib = 2**20
    torch.ones(24 * mib // 4)  # a large block freed: glibc's mmap threshold rises above the blocks below
    blocks = [torch.ones(4 * mib // 4) for _ in range(64)]  # 256 MiB from the heap, touched
    last = blocks[-1]  # kept: the heap's top stays in use, so nothing is trimmed by itself
    del blocks
    held = resident()
    assert host_memory.release_freed()
    assert held - resident() > 128 * mib  # most of the 252 MiB freed came back
    assert last.sum() > 0


def test_only_large_models_release_after_a_stage(monkeypatch):
    calls = []
    monkeypatch.setattr(host_memory, "release_freed", lambda: calls.append(1) or True)
    small = [torch.zeros(1000)]
    assert not host_memory.release_after(small) and not calls
    large = [torch.empty(host_memory.RELEASE_ABOVE // 4, device="meta")]  # counted by size, never allocated
    assert host_memory.release_after(large) and calls == [1]


def test_weight_matching_releases_its_working_set_before_transforming_b(monkeypatch):
    order = []
    monkeypatch.setattr(weight, "release_after", lambda tensors: order.append(("release", len(list(tensors)))))
    apply = weight.apply
    monkeypatch.setattr(weight, "apply", lambda *args, **kw: order.append(("apply",)) or apply(*args, **kw))
    a, b = tiny_pair()
    weight.WeightMatcher(max_iter=2).match(a, b)
    assert order == [("release", len(b.params())), ("apply",)]


def test_a_slow_path_writes_a_line_per_point_where_progress_is_shown(monkeypatch, caplog):
    from glmc.eval import evaluator

    a, b = tiny_pair()
    monkeypatch.setattr(evaluator, "PROGRESS_EVERY_S", 0.0)  # every point as slow as a large model's
    with caplog.at_level(logging.INFO, logger="glmc.eval.evaluator"):
        evaluator.Evaluator(batches(), "causal_lm", progress=False).path(Alignment(a, b), [0.0, 1.0], desc="quiet")
        assert not caplog.messages  # a quiet evaluator (a matcher's checks) writes none
        curve = evaluator.Evaluator(batches(), "causal_lm", progress=True).path(Alignment(a, b), [0.0, 0.5, 1.0], "w")
    assert [m.split(",")[0] for m in caplog.messages] == [f"w: {i} of 3 points" for i in (1, 2, 3)]
    assert f"loss {curve['loss'][-1]:.4f} at lambda 1" in caplog.messages[-1]


def test_apply_transforms_a_group_of_tensors_at_a_time_with_the_same_floats(monkeypatch):
    import dataclasses
    import importlib

    from glmc.models.canonical import CanonicalTransformer
    from glmc.symmetry.spec import SymmetrySpec

    apply_module = importlib.import_module("glmc.symmetry.apply")  # the package's `apply` is the function

    a, b = tiny_pair()
    transform, _ = weight.weight_matching(a, b, max_iter=2)
    spec, params = SymmetrySpec.from_model(b), b.params()
    whole = apply_module.apply_params(transform, spec, {k: v.double() for k, v in params.items()})
    sizes = []
    apply_params = apply_module.apply_params
    counted = lambda t, s, p, strict: sizes.append(len(p)) or apply_params(t, s, p, strict)  # noqa: E731
    monkeypatch.setattr(apply_module, "apply_params", counted)
    moved = apply_module.apply(transform, b)
    assert isinstance(moved, CanonicalTransformer) and moved.config == dataclasses.replace(b.config)
    assert list(moved.params()) == list(params)
    assert all(torch.equal(moved.params()[k], whole[k].float()) for k in params)
    assert sum(sizes) == len(params) and max(sizes) < len(params) / 2  # each layer, then the rest
