"""Multi-model and width-heterogeneous runs end to end on tiny digits ViTs."""

from __future__ import annotations

import json
import math

import pytest

from glmc.pipeline.run import run_pipeline

from conftest import compose_config
from numeric import FORWARD


@pytest.mark.parametrize(("stream", "methods"), [("keep", ["weight", "learned"]), ("rms", ["weight"])])
def test_narrower_endpoints_are_embedded_and_aligned_to_the_first(tmp_path, tiny_overrides, stream, methods):
    cfg = compose_config(
        *tiny_overrides,
        "seeds=[0,1,2]",
        "pairing=first",
        f"matcher.methods=[{','.join(methods)}]",
        "matcher.learned.max_steps=3",
        "endpoint_models=[{},{hidden_size:8,num_heads:1,mlp_size:16},{hidden_size:12,num_heads:2,mlp_size:24}]",
        f"embed_stream={stream}",
    )
    results = run_pipeline(cfg, tmp_path / "run")
    assert [e["width"] for e in results["endpoints"]] == [16, 8, 12]
    for name in methods:
        method = results["methods"][name]
        assert [p["seeds"] for p in method["pairs"]] == [[0, 1], [0, 2]]
        for pair in method["pairs"]:
            # the embedded narrow model computes what the narrow endpoint computes
            assert pair["function_preserving"] and pair["endpoint_deviation"] < FORWARD
            assert all(math.isfinite(x) for x in pair["test_loss"])


def test_endpoint_models_are_checked_before_any_work(tmp_path, tiny_overrides):
    one = compose_config(*tiny_overrides, "seeds=[0,1]", "pairing=first", "endpoint_models=[{}]")
    with pytest.raises(ValueError, match="endpoint_models has 1 entries for 2 seeds"):
        run_pipeline(one, tmp_path / "a")
    vanilla = compose_config(*tiny_overrides, "seeds=[0,1]", "pairing=first", "endpoint_models=[{},{hidden_size:8}]")
    with pytest.raises(ValueError, match="vanilla"):
        run_pipeline(vanilla, tmp_path / "b")


def test_universe_run_reports_the_simplex_and_pairwise_barriers(tmp_path, tiny_overrides):
    cfg = compose_config(
        *tiny_overrides,
        "seeds=[0,1,2]",
        "pairing=universe",
        "multi.methods=[vanilla,weight,learned]",
        "multi.max_steps=3",
        "multi.max_rounds=2",
    )
    run_pipeline(cfg, tmp_path / "run")
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    multi = saved["multi"]
    assert set(multi) == {"vanilla", "weight", "learned"}
    for name, m in multi.items():
        assert len(m["points"]) == 66 and len(m["test_loss"]) == 66, name
        assert m["barrier"] == pytest.approx(max(m["excess"]))
        assert set(m["pairwise_barriers"]) == {"0-1", "0-2", "1-2"}
    assert multi["weight"]["diagnostics"]["rounds"] <= 2
    png = (tmp_path / "run" / "simplex.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_universe_needs_three_endpoints(tmp_path, tiny_overrides):
    cfg = compose_config(*tiny_overrides, "seeds=[0,1]", "pairing=universe")
    with pytest.raises(ValueError, match="three or more"):
        run_pipeline(cfg, tmp_path / "run")
