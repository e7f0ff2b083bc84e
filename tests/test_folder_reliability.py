"""Model folders that would give wrong or no answers are refused naming the folder (endpoints=pretrained):
non-finite weights, a tokenizer that maps text to other ids than the one the run encodes with; and a
merged model exported by a run holds the tokenizer, so it can be an endpoint folder again."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_pretrained_endpoints import SEQ_LEN, TINY, char_tokenizer, pretrained

from glmc import align, to_canonical
from glmc.data.pydoc_corpus import pydoc_text
from glmc.data.text import CharTokenizer, saved_tokenizer
from glmc.models.build import build_model
from glmc.models.convert import nonfinite_weight
from glmc.models.export import EXPORT_FILE
from glmc.pipeline.endpoints import load_endpoints
from glmc.pipeline.folder_fit import check_tokenizer
from glmc.pipeline.hf_folders import FolderError, read_folder
from glmc.pipeline.merges import save_tokenizer
from glmc.pipeline.run import run_pipeline
from glmc.pipeline.validate import ConfigError, validate_config

from tiny_hf import tiny_gpt2

TEXT = ("data=pydoc", f"data.seq_len={SEQ_LEN}")
TENSOR = "transformer.h.0.attn.c_attn.weight"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """`folders(family, tag, seed)` -> a folder of a tiny model saved with save_pretrained beside the
    character tokenizer (as in test_pretrained_endpoints), written once per module."""
    root, tokenizer, written = tmp_path_factory.mktemp("checkpoints"), char_tokenizer(), {}

    def write(family: str, tag: str, seed: int = 0):
        if tag not in written:
            torch.manual_seed(seed)
            folder = root / f"{family}_{tag}"
            build_model(dataclasses.replace(TINY, family=family, vocab_size=len(tokenizer))).save_pretrained(folder)
            tokenizer.save_pretrained(folder)
            written[tag] = folder
        return written[tag]

    return write


def _copy(folder, tmp_path, name):
    target = tmp_path / name
    shutil.copytree(folder, target)
    return target


def _poison(folder, value: float):
    """One entry of one tensor of the folder's safetensors file set to `value` (NaN or Inf)."""
    file = folder / "model.safetensors"
    tensors = load_file(str(file))
    tensors[TENSOR][0, 1] = value
    save_file(tensors, str(file), metadata={"format": "pt"})


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_a_folder_with_nonfinite_weights_is_refused_naming_the_tensor(value, folders, tmp_path):
    good = folders("gpt2", "a")
    bad = _copy(folders("gpt2", "b", seed=1), tmp_path, "bad")
    _poison(bad, value)
    message = f"endpoints.paths[1]={bad}: its weight {TENSOR} (in model.safetensors) holds 1 NaN or infinite value"
    with pytest.raises(FolderError, match=re.escape(message)):
        load_endpoints(pretrained([good, bad], *TEXT), evaluator=None)
    # through the whole run, for a matcher that would fail deep inside and for one that gave null barriers
    for method in ("weight", "vanilla"):
        cfg = pretrained([good, bad], *TEXT, f"matcher.methods=[{method}]", tmp_path=tmp_path)
        with pytest.raises(FolderError, match=re.escape(message)):
            run_pipeline(cfg, tmp_path / f"run_{method}")
        assert not (tmp_path / f"run_{method}" / "results.json").exists()


def test_finite_weights_whose_sum_overflows_are_not_refused():
    model = tiny_gpt2(0)
    with torch.no_grad():
        model.transformer.h[0].mlp.c_fc.weight[:4, 0] = 3e38  # finite entries, an infinite float32 sum
    assert not bool(torch.isfinite(model.transformer.h[0].mlp.c_fc.weight.sum()))
    assert nonfinite_weight(model) is None
    with torch.no_grad():
        model.transformer.h[0].mlp.c_fc.weight[5, 0] = math.inf
    assert nonfinite_weight(model) == (
        "transformer.h.0.mlp.c_fc.weight",
        1,
        model.transformer.h[0].mlp.c_fc.weight.numel(),
    )


def test_align_refuses_a_model_with_nonfinite_weights_naming_it():
    a, b = tiny_gpt2(0), tiny_gpt2(1)
    with torch.no_grad():
        b.transformer.h[1].mlp.c_fc.weight[2, 3] = math.nan
        b.transformer.h[1].mlp.c_fc.weight[0, 0] = -math.inf
    message = "model_b's weight transformer.h.1.mlp.c_fc.weight holds 2 NaN or infinite value(s)"
    with pytest.raises(ValueError, match=re.escape(message)):
        align(a, b, "weight")
    with pytest.raises(ValueError, match=re.escape("the model's weight transformer.h.1.mlp.c_fc.weight holds 2")):
        to_canonical(b)
    canonical = to_canonical(a)
    with torch.no_grad():
        canonical.head.w[0, 0] = math.nan
    with pytest.raises(ValueError, match=re.escape("model_a's weight head.w holds 1 NaN")):
        align(canonical, tiny_gpt2(1), "vanilla")


def _swap_ids(folder, first: str, second: str) -> tuple[int, int]:
    """Swap two tokens' ids in the folder's tokenizer.json; returns their ids before."""
    file = folder / "tokenizer.json"
    tokenizer = json.loads(file.read_text())
    vocab = tokenizer["model"]["vocab"]
    ids = vocab[first], vocab[second]
    vocab[first], vocab[second] = ids[1], ids[0]
    file.write_text(json.dumps(tokenizer))
    return ids


def _set_special(folder, role: str, token: str) -> None:
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        if (folder / name).is_file():
            settings = json.loads((folder / name).read_text())
            (folder / name).write_text(json.dumps({**settings, role: token}))


def test_folders_whose_tokenizers_differ_are_refused_naming_both(folders, tmp_path):
    a, b = folders("gpt2", "a"), folders("gpt2", "b", seed=1)
    validate_config(pretrained([a, b], *TEXT))  # one tokenizer saved in both: accepted
    swapped = _copy(b, tmp_path, "swapped")
    id_a, id_b = _swap_ids(swapped, "a", "b")
    assert id_a < id_b  # 'a' comes first in the reference's id order, so it is the example named
    message = (
        f"endpoints.paths[1]={swapped} holds a tokenizer other than that of endpoints.paths[0]={a}: token 'a' has "
        f"id {id_b} in endpoints.paths[1]={swapped} and id {id_a} in endpoints.paths[0]={a}"
    )
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate_config(pretrained([a, swapped], *TEXT))
    special = _copy(b, tmp_path, "special")
    _set_special(special, "pad_token", "[SEP]")
    with pytest.raises(ConfigError, match=re.escape("its pad_token is '[SEP]' in endpoints.paths[1]=")):
        validate_config(pretrained([a, special], *TEXT))
    # a folder without a tokenizer is not compared
    bare = _copy(b, tmp_path, "bare")
    for file in bare.glob("tokenizer*.json"):
        file.unlink()
    validate_config(pretrained([a, bare], *TEXT))


def test_one_tokenizer_named_on_purpose_is_used_with_a_warning(folders, tmp_path, caplog):
    a, b = folders("gpt2", "a"), folders("gpt2", "b", seed=1)
    swapped = _copy(b, tmp_path, "swapped")
    _swap_ids(swapped, "a", "b")
    cfg = pretrained([a, swapped], *TEXT, f"data.tokenizer_path={a}")
    validate_config(cfg)  # no refusal: named on purpose
    with caplog.at_level(logging.WARNING, logger="glmc.pipeline.folder_fit"):
        check_tokenizer(cfg, len(char_tokenizer()))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert f"endpoints.paths[1]={swapped} holds a tokenizer other than that of endpoints.paths[0]={a}" in warnings[0]
    assert f"it is not used: data.tokenizer_path={a} encodes the text for every folder" in warnings[0]


def test_an_exported_midpoint_of_two_folders_is_an_endpoint_folder_again(folders, tmp_path):
    a, b = folders("gpt2", "a"), folders("gpt2", "b", seed=1)
    # weight matching with factored heads and a mean-zero stream: its midpoint has a GPT-2 form
    weight = ("matcher.weight.qk=none", "matcher.weight.vo=none", "matcher.weight.keep_mean=auto")
    cfg = pretrained([a, b], *TEXT, "matcher.methods=[vanilla,weight]", *weight, "merge.export=true")
    methods = run_pipeline(cfg, tmp_path / "run")["methods"]
    for name in ("vanilla", "weight"):
        export = methods[name]["pairs"][0]["export"]
        assert export["exported"] and export["tokenizer"].startswith(f"copied from {a} (tokenizer.json"), name
    merged = tmp_path / "run" / "weight" / f"hf_{a.name}-{b.name}"
    assert read_folder(str(merged), 0, "causal_lm").hf_class == "GPT2LMHeadModel"
    assert saved_tokenizer(merged).vocab_size == len(char_tokenizer())
    results = run_pipeline(pretrained([merged, a], *TEXT, "matcher.methods=[weight]"), tmp_path / "again")
    assert [e["path"] for e in results["endpoints"]] == [str(merged), str(a)]
    assert math.isfinite(results["methods"]["weight"]["pairs"][0]["barrier"])


def test_a_tokenizer_built_by_the_run_is_saved_with_the_same_ids(tmp_path):
    from glmc.data.wordpiece import trained_wordpiece

    text = pydoc_text()[:4000]
    chars = CharTokenizer(text)
    assert "character tokenizer" in save_tokenizer(chars, tmp_path / "char")
    assert saved_tokenizer(tmp_path / "char").encode(text) == chars.encode(text)
    wordpiece = trained_wordpiece(text, 120)
    assert "WordPiece" in save_tokenizer(wordpiece, tmp_path / "wordpiece")
    assert saved_tokenizer(tmp_path / "wordpiece").encode(text) == wordpiece.encode(text)
    # a tokenizer of no Hugging Face form: the folder says why none is there
    (tmp_path / "other").mkdir()
    note = save_tokenizer(object(), tmp_path / "other")
    assert "no tokenizer saved" in note
    assert json.loads((tmp_path / "other" / EXPORT_FILE).read_text())["tokenizer"] == note
