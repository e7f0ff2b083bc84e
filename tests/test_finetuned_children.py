"""endpoints=finetuned: children's configs and cache keys, their pairs, merges on each model's own data, the
copied classifier, and the roberta_finetune report reading nothing but the runs' results.json."""

from __future__ import annotations

import itertools
import json

import pytest
import torch

from glmc.interpolation import merge_params
from glmc.models import to_canonical
from glmc.pipeline.children import pair_lists, task_config, with_head
from glmc.pipeline.endpoints import cache_key
from glmc.pipeline.merges import own_data_merges, own_statistics
from glmc.report import roberta_finetune as rf

from conftest import compose_config
from tiny_hf import tiny_encoder

TINY = ("experiment=roberta_finetune", "debug=fast", *rf.TINY, "logger=none")


def test_pairs_share_the_task_and_differ_in_seed_or_share_the_seed_across_tasks():
    pairs = pair_lists(3, [0, 1, 2])
    assert pairs["same"][:3] == [((0, 0), (0, 1)), ((0, 0), (0, 2)), ((0, 1), (0, 2))]
    assert len(pairs["same"]) == 9 and all(a[0] == b[0] and a[1] < b[1] for a, b in pairs["same"])
    assert pairs["cross"][:3] == [((0, 0), (1, 0)), ((0, 1), (1, 1)), ((0, 2), (1, 2))]
    assert len(pairs["cross"]) == 9 and all(a[1] == b[1] and a[0] < b[0] for a, b in pairs["cross"])


def test_a_child_is_keyed_as_a_fine_tuned_endpoint_of_its_task_with_the_parent_in_its_key():
    cfg = compose_config(*TINY)
    child = cache_key(task_config(cfg, 1))
    # the same entry an endpoints=trained run on that task fine-tunes: cached children are shared
    assert child == cache_key(compose_config(*TINY, "endpoints=trained", "data.subset=1"))
    assert child["data"]["subset"] == 1 and child != cache_key(task_config(cfg, 0))
    parent = child["train"]["start_from"]
    assert parent["model"]["head"] == "mlm" and parent["data"]["task"] == "masked_lm"


def test_a_task_override_that_data_does_not_have_names_the_task():
    cfg = compose_config(*TINY)
    cfg.endpoints.tasks = [{"subset": 0}, {"subsett": 1}]
    assert task_config(cfg, 0).data.subset == 0
    with pytest.raises(ValueError, match=r"endpoints.tasks\[1\]: .*subsett"):
        task_config(cfg, 1)


@pytest.fixture(scope="module")
def pair():
    """Two tiny RoBERTa classifiers (canonical) and each one's own training batches."""
    models = [to_canonical(tiny_encoder("roberta", "classification", seed=s, layers=1).eval()) for s in (0, 1)]
    draw = torch.Generator().manual_seed(0)
    batches = [
        [(torch.randint(0, 50, (4, 6), generator=draw), torch.randint(0, 3, (4,), generator=draw))] for _ in models
    ]
    return models, batches


def test_merges_take_each_models_statistics_on_its_own_batches(pair):
    (a, b), (own_a, own_b) = pair
    kinds = ["average", "fisher", "regmean"]
    sa, sb = own_statistics(kinds, a, own_a), own_statistics(kinds, b, own_b)
    assert sa["average"] == (None, 0.0) and set(sa) == set(kinds)
    merged = own_data_merges(kinds, a, b, (sa, sb), alpha=0.9)
    midpoint = merge_params([a.params(), b.params()], [0.5, 0.5])
    assert all(torch.equal(merged["average"][0].params()[k], v) for k, v in midpoint.items())
    # equal Fisher weights: Fisher averaging is the plain average; B's own batches make them differ
    same = own_data_merges(["fisher"], a, b, (sa, sa), alpha=0.9)["fisher"][0].params()
    assert all(torch.allclose(same[k], v, atol=1e-6) for k, v in midpoint.items())
    differ = merged["fisher"][0].params()
    assert any(not torch.allclose(differ[k], v, atol=1e-6) for k, v in midpoint.items())
    assert merged["regmean"][0].config == a.config


def test_the_copied_classifier_is_the_given_models_and_the_encoder_the_merged_ones(pair):
    (a, b), _ = pair
    both = with_head(a, b).params()
    heads = [k for k in both if k.startswith("head.")]
    assert heads and all(torch.equal(both[k], b.params()[k]) for k in heads)
    assert all(torch.equal(v, a.params()[k]) for k, v in both.items() if k not in heads)


def _children(scope: str) -> list[dict]:
    """A run's `children` records as glmc.pipeline.children writes them, with made-up scores."""
    records = []
    methods = {"vanilla": ["main"], "rotation": ["main", "permutation_only", "head_permutation", "no_rescale"]}
    if scope == "whole":
        methods.pop("vanilla")
    for i, (kind, pair) in enumerate(itertools.product(rf.KINDS, ["p0", "p1"])):
        records.append({"kind": kind, "pair": f"{kind}{pair}", "method": "endpoints", "f1": 0.9, "accuracy": 0.95})
        for (method, variants), merge in itertools.product(methods.items(), ["average", "fisher", "regmean"]):
            for j, variant in enumerate(variants):
                f1 = 0.1 * i + 0.01 * j + (0.2 if scope == "whole" else 0.0)
                measured = {"match_seconds": 0.5 if variant == "main" else None, "merge_seconds": 0.1, "distance": 0.3}
                records.append(
                    {"kind": kind, "pair": f"{kind}{pair}", "method": method, "variant": variant, "merge": merge}
                )
                records[-1].update(
                    f1=f1, accuracy=f1, deviation=1e-7, moved=0.25 if variant == "main" else None, **measured
                )
    return records


def test_the_report_reads_the_two_runs_results_and_maps_variants_to_rows(tmp_path):
    for scope, (_, label) in rf.SCOPES.items():
        (tmp_path / label).mkdir()
        endpoints = [{"task": 0, "seed": 0, "test_accuracy": 0.5}]
        results = {"children": _children(scope), "endpoints": endpoints, "config": {"seeds": [0, 1]}}
        (tmp_path / label / "results.json").write_text(json.dumps(results))
    records, checks = rf.measure(tmp_path)
    stats = rf.summarise(records)
    assert set(stats) == {(k, *row, m) for k in rf.KINDS for row in rf.ROWS for m in rf.MERGES}
    # cross pairs are the 3rd and 4th (i = 2, 3); head_permutation is variant 2; the whole run adds 0.2
    assert stats[("cross", "whole", "permutation", "fisher")]["per_pair"] == pytest.approx([100 * 0.42, 100 * 0.52])
    assert stats[("same", "attention", "rescaled", "simple")]["per_pair"] == pytest.approx([0.0, 10.0])
    assert stats[("same", "none", "vanilla", "regmean")]["f1"] == pytest.approx(5.0)
    assert stats[("same", "endpoints", "endpoints", "regmean")]["f1"] == pytest.approx(90.0)
    assert [r["pair"] for r in records[:: len(records) // 4]] == ["samep0", "samep1", "crossp0", "crossp1"]
    assert checks == {"deviation": 1e-7, "accuracy_vs_runs": 0.0, "seeds": [0, 1], "moved": 0.25}
