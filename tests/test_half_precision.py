"""Folders stored in bfloat16 or float16 (endpoints=pretrained) load in float32, are aligned and evaluated
in float32, and their merged midpoint is exported in their own dtype; results.json states both dtypes.
Folders of different dtypes are aligned in float32 too, with a warning naming each folder and its dtype
(the export takes A's). glmc.align on half-precision models aligns a float32 copy."""

from __future__ import annotations

import dataclasses
import json
import logging
import math

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from test_pretrained_endpoints import FAST, TINY, char_tokenizer
from test_text_file_data import OWN, no_plot, own_config, own_text  # noqa: F401 (no_plot: the fixture pytestmark uses)

from glmc import align
from glmc.models.build import build_model
from glmc.pipeline.hf_folders import load_model, read_folder
from glmc.pipeline.run import run_pipeline

from conftest import run_script
from numeric import FORWARD, assert_close_rel
from tiny_hf import inputs_for, tiny_gpt2

pytestmark = pytest.mark.usefixtures("no_plot")  # barrier.png has its own tests
# weight matching without circuits: its midpoint has a Hugging Face shape and is exported
EXPORTED = ("matcher.methods=[weight]", "matcher.weight.qk=none", "matcher.weight.vo=none", "merge.export=true")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """`folders(tag, seed, dtype)` -> a tiny Llama saved with save_pretrained in `dtype` beside the character
    tokenizer, written once per module; `folders.text` the text file the runs evaluate on."""
    root, tokenizer, written = tmp_path_factory.mktemp("half"), char_tokenizer(), {}
    text = root / "text.txt"
    text.write_text(own_text(), encoding="utf-8")

    def write(tag: str, seed: int, dtype: torch.dtype):
        if tag not in written:
            torch.manual_seed(seed)
            model = build_model(dataclasses.replace(TINY, family="llama", vocab_size=len(tokenizer)))
            folder = root / tag
            model.to(dtype).save_pretrained(folder)
            tokenizer.save_pretrained(folder)
            written[tag] = folder
        return written[tag]

    write.text = text
    return write


def _file_dtypes(folder) -> set[str]:
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        return {f.get_slice(name).get_dtype() for name in f.keys()}


@pytest.mark.numeric
def test_a_bfloat16_pair_aligns_in_float32_and_exports_in_bfloat16(folders, tmp_path, monkeypatch, capsys):
    a, b = folders("bf16_a", 0, torch.bfloat16), folders("bf16_b", 1, torch.bfloat16)
    assert _file_dtypes(a) == {"BF16"}
    run = tmp_path / "run"
    paths = f"endpoints.paths=[{a},{b}]"
    args = (*FAST, "endpoints=pretrained", paths, *OWN, f"data.path={folders.text}", *EXPORTED, f"hydra.run.dir={run}")
    code, _, err = run_script(monkeypatch, capsys, *args)
    assert code == 0, err[-3000:]
    results = json.loads((run / "results.json").read_text())
    assert (results["eval_dtype"], results["stored_dtype"]) == ("float32", "bfloat16")
    assert [e["stored_dtype"] for e in results["endpoints"]] == ["bfloat16", "bfloat16"]
    pair = results["methods"]["weight"]["pairs"][0]
    assert math.isfinite(pair["barrier"]) and pair["function_preserving"]
    assert pair["endpoint_deviation"] < FORWARD  # the aligned B computes B's function, checked in float32
    export = pair["export"]
    assert export["exported"] and export["dtype"] == "bfloat16", export
    assert export["relative_deviation"] < 2e-2  # read back in float32: the rounding to bfloat16 only
    exported = run / "weight" / f"hf_{a.name}-{b.name}"
    assert _file_dtypes(exported) == {"BF16"}
    assert json.loads((exported / "config.json").read_text()).get("dtype") == "bfloat16"
    again = read_folder(str(exported), 0, "causal_lm")  # an endpoint folder again
    assert again.dtype == "bfloat16" and next(load_model(again).parameters()).dtype == torch.float32


def test_a_float16_pair_loads_exactly_in_float32(folders, tmp_path):
    a, b = folders("f16_a", 0, torch.float16), folders("f16_b", 1, torch.float16)
    folder = read_folder(str(a), 0, "causal_lm")
    assert folder.dtype == "float16" and _file_dtypes(a) == {"F16"}
    model = load_model(folder)
    stored = load_file(str(a / "model.safetensors"))
    for name, param in model.state_dict().items():
        assert param.dtype == torch.float32, name
        if name in stored:  # float32 holds every float16 value: the load converts exactly
            assert torch.equal(param, stored[name].float()), name
    results = run_pipeline(own_config([a, b], folders.text, *EXPORTED), tmp_path / "run")
    assert results["stored_dtype"] == "float16" and math.isfinite(results["methods"]["weight"]["barrier"])
    assert results["methods"]["weight"]["pairs"][0]["export"]["dtype"] == "float16"


def test_folders_of_different_dtypes_align_in_float32_and_export_in_as_dtype(folders, tmp_path, caplog):
    a, b = folders("bf16_a", 0, torch.bfloat16), folders("f32_b", 1, torch.float32)
    with caplog.at_level(logging.WARNING, logger="glmc.pipeline.hf_folders"):
        results = run_pipeline(own_config([a, b], folders.text, *EXPORTED), tmp_path / "run")
    warned = [r.getMessage() for r in caplog.records if "different dtypes" in r.getMessage()]
    assert len(warned) == 1
    for line in (f"endpoints.paths[0]={a} in bfloat16", f"endpoints.paths[1]={b} in float32", "A's dtype"):
        assert line in warned[0], warned[0]
    assert results["stored_dtype"] == "mixed" and results["eval_dtype"] == "float32"
    assert [e["stored_dtype"] for e in results["endpoints"]] == ["bfloat16", "float32"]
    export = results["methods"]["weight"]["pairs"][0]["export"]
    assert export["exported"] and export["dtype"] == "bfloat16"
    assert _file_dtypes(tmp_path / "run" / "weight" / f"hf_{a.name}-{b.name}") == {"BF16"}


@pytest.mark.numeric
@pytest.mark.parametrize("method", ["weight", "vanilla"])
def test_align_on_bfloat16_models_preserves_bs_float32_function(method):
    a, b = tiny_gpt2(0).to(torch.bfloat16), tiny_gpt2(1).to(torch.bfloat16)
    x = inputs_for(a)
    alignment = align(a, b, method)
    assert next(alignment.model.parameters()).dtype == torch.float32
    assert next(b.parameters()).dtype == torch.bfloat16  # the caller's models are left as they were
    with torch.no_grad():
        aligned = alignment.model(x)
        expected = tiny_gpt2(1).to(torch.bfloat16).float()(x).logits
    assert_close_rel(getattr(aligned, "logits", aligned), expected, FORWARD, f"{method}: aligned B vs B in float32")
