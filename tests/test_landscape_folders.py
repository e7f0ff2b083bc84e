"""Layer-wise barriers, a curve and the plane on users' own folders (endpoints=pretrained): each method's pair
record holds all three, and interpolating every part reproduces the straight line."""

import math

from family_checks import cli_on_two_folders

LANDSCAPE = (
    "eval.layerwise=single",
    "curve=bezier",
    "curve.max_steps=2",
    "eval.plane.enabled=true",
    "eval.plane.grid=2",
)


def test_the_landscape_of_two_llama_folders(monkeypatch, capsys, tmp_path):
    results = cli_on_two_folders(monkeypatch, capsys, tmp_path, "llama", extra=LANDSCAPE)
    for name in ("vanilla", "weight"):
        pair = results["methods"][name]["pairs"][0]
        layerwise, curve = pair["layerwise"], pair["curve"]
        assert layerwise["parts"][0] == "embed" and layerwise["parts"][-1] == "head"
        assert all(math.isfinite(b) for b in layerwise["held_at_a"]["barrier"]), name
        assert math.isfinite(curve["barrier"]) and math.isfinite(curve["linear_barrier"]), name
    plane = results["methods"]["weight"]["pairs"][0]["plane"]
    assert len(plane["loss"]) == 2 and len(plane["model_loss"]) == 3
    # vanilla's aligned B is B: no plane, and the record says why
    assert "its aligned B is B" in results["methods"]["vanilla"]["pairs"][0]["plane"]["skipped"]
