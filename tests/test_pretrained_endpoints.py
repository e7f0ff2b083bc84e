"""Your own checkpoints (endpoints=pretrained): two Hugging Face folders per registered family run through
the pipeline like trained endpoints, and folders that cannot be used are refused naming the folder.

The folders are written here with save_pretrained from tiny models built through each family (text ones
with a character-level tokenizer over the embedded corpus, saved beside the weights); nothing is
downloaded. Every family of the registry is run, so a family added there is covered without an edit."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil

import pytest
import torch

from glmc.config import ModelConfig
from glmc.models.build import build_model
from glmc.models.families import family_named, family_names
from glmc.pipeline.endpoints import load_endpoints
from glmc.pipeline.hf_folders import FolderError, load_model, read_folder
from glmc.pipeline.run import run_pipeline
from glmc.pipeline.validate import ConfigError, validate_config
from glmc.symmetry.family_defaults import block_record

from conftest import compose_config

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
SEQ_LEN = 16
TINY = ModelConfig(
    hidden_size=16,
    num_layers=1,
    num_heads=2,
    mlp_size=32,
    max_positions=SEQ_LEN,
    image_size=8,
    patch_size=4,
    num_channels=1,
    num_labels=10,
    head="mlm",
)
FAST = ("debug=fast", "logger=none", "data.limit_train=64", "data.limit_test=32")


def data_overrides(name: str) -> list[str]:
    """The dataset a family's tiny models are evaluated on, by what the family reads."""
    family = family_named(name)
    data = ["data=digits"] if family.data_kind == "images" else []
    if family.data_kind == "text":
        data = ["data=pydoc" if "causal_lm" in family.tasks else "data=pydoc_mlm", f"data.seq_len={SEQ_LEN}"]
    return data  # no symmetry override: symmetry=auto picks the family's widest residual class


def char_tokenizer():
    """A character-level fast tokenizer over the embedded corpus, with BERT's special tokens first."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from glmc.data.pydoc_corpus import pydoc_text

    vocab = {t: i for i, t in enumerate([*SPECIALS, *sorted(set(pydoc_text()))])}
    # a BPE without merges reads one id per character, as a word-level vocabulary behind a per-character
    # split would, about three times faster on the whole corpus
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="[UNK]"))
    names = ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token")
    return PreTrainedTokenizerFast(tokenizer_object=tok, **dict(zip(names, SPECIALS)))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """`folders(family, tag, **model)` -> a folder holding a tiny model of that family saved with
    save_pretrained (and the tokenizer, for text); written once per module and arguments."""
    root = tmp_path_factory.mktemp("checkpoints")
    tokenizer = char_tokenizer()
    written = {}

    def write(family: str, tag: str, seed: int = 0, **model):
        key = (family, tag, seed, tuple(sorted(model.items())))
        if key not in written:
            torch.manual_seed(seed)
            fixed = family_named(family).fixed_model_values  # what the architecture fixes (OPT's LayerNorm eps)
            cfg = dataclasses.replace(TINY, family=family, **{"vocab_size": len(tokenizer), **fixed, **model})
            folder = root / f"{family}_{tag}"
            build_model(cfg).save_pretrained(folder)
            if family_named(family).data_kind == "text":
                tokenizer.save_pretrained(folder)
            written[key] = folder
        return written[key]

    return write


def pretrained(paths, *overrides, tmp_path=None):
    cache = [f"cache_dir={tmp_path / 'cache'}"] if tmp_path is not None else []
    listed = ",".join(str(p) for p in paths)
    return compose_config(*FAST, *cache, "endpoints=pretrained", f"endpoints.paths=[{listed}]", *overrides)


# gemma, gemma2, gemma3, gpt_neox, mixtral, olmo2, opt and qwen3, and the mixtures of experts olmoe, qwen2_moe and
# qwen3_moe, run run.py on two folders with an export in their own test files
OWN_FOLDER_TESTS = (
    *("gemma", "gemma2", "gemma3", "gpt_neox", "mixtral", "olmo2", "opt", "qwen3"),
    *("olmoe", "qwen2_moe", "qwen3_moe"),
)


@pytest.mark.parametrize("family", [f for f in family_names() if f not in OWN_FOLDER_TESTS])
def test_two_folders_of_every_family_give_barriers_and_an_export(family, folders, tmp_path):
    a, b = folders(family, "a", seed=0), folders(family, "b", seed=1)
    methods = ("matcher.methods=[vanilla,weight]", "merge.export=true")
    cfg = pretrained([a, b], *data_overrides(family), *methods, tmp_path=tmp_path)
    results = run_pipeline(cfg, tmp_path / "run")
    assert [e["name"] for e in results["endpoints"]] == [a.name, b.name]
    assert [e["path"] for e in results["endpoints"]] == [str(a), str(b)]
    assert results["model"] == f"{family} ({a.name}, {b.name})"
    widest = family_named(family).residual_classes[0]
    blocks = block_record(family_named(family))
    assert results["symmetry"] == {"residual": widest, "source": "family default", "family": family, "blocks": blocks}
    assert results["config"]["matcher"]["weight"]["residual"] == widest
    for name in ("vanilla", "weight"):
        pair = results["methods"][name]["pairs"][0]
        assert pair["endpoints"] == [a.name, b.name] and pair["seeds"] == [0, 1]
        assert math.isfinite(pair["barrier"]) and math.isfinite(pair["barrier_vs_mean"]), name
    export = results["methods"]["vanilla"]["pairs"][0]["export"]
    assert export["exported"] and export["relative_deviation"] < 1e-5
    assert (tmp_path / "run" / "vanilla" / f"hf_{a.name}-{b.name}" / "model.safetensors").is_file()
    assert (tmp_path / "run" / "results.json").is_file() and (tmp_path / "run" / "barrier.png").is_file()
    assert not (tmp_path / "cache").exists()  # nothing trained, nothing cached


def test_merges_run_on_loaded_folders(folders, tmp_path):
    a, b = folders("vit", "a", seed=0), folders("vit", "b", seed=1)
    results = run_pipeline(pretrained([a, b], "data=digits", "merge=all", "matcher.methods=[weight]"), tmp_path / "run")
    merges = results["methods"]["weight"]["pairs"][0]["merges"]
    assert set(merges) == {"fisher", "regmean"} and all(math.isfinite(m["test_loss"]) for m in merges.values())


def test_folders_of_different_widths_are_embedded_into_the_wider(folders, tmp_path):
    wide = folders("vit", "wide", hidden_size=32, num_heads=4, mlp_size=64)
    narrow = folders("vit", "a", seed=0)
    cfg = pretrained([wide, narrow], "data=digits", "matcher.methods=[weight]")
    results = run_pipeline(cfg, tmp_path / "run")
    assert [e["width"] for e in results["endpoints"]] == [32, 16]
    pair = results["methods"]["weight"]["pairs"][0]
    assert math.isfinite(pair["barrier"]) and pair["endpoint_deviation"] < 1e-4
    # merges take models of one norm
    with pytest.raises(ConfigError, match=re.escape("merge.kinds=[fisher,regmean]: Fisher and RegMean merge")):
        validate_config(pretrained([wide, narrow], "data=digits", "matcher.methods=[weight]", "merge=all"))
    # vanilla cannot interpolate models of two shapes, and the narrower may not come first
    with pytest.raises(ConfigError, match=r"endpoints.paths\[1\]=.*vit_a has width 16 .* vanilla interpolates"):
        validate_config(pretrained([wide, narrow], "data=digits"))
    with pytest.raises(ConfigError, match=re.escape(f"endpoints.paths[1]={wide} (width 32, 4 heads) is wider")):
        validate_config(pretrained([narrow, wide], "data=digits", "matcher.methods=[weight]"))


def _copy(folder, tmp_path, name):
    target = tmp_path / name
    shutil.copytree(folder, target)
    return target


def _edit_config(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def _truncate(file):
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])


DAMAGE = {
    # name -> (what is done to a copy of a good GPT-2 folder, the message after the folder's key)
    "missing folder": (lambda f: shutil.rmtree(f), "no such folder"),
    "no config": (lambda f: (f / "config.json").unlink(), "holds no config.json"),
    "invalid json": (lambda f: (f / "config.json").write_text('{"model_type": "gp'), "config.json is not valid JSON"),
    "unknown model_type": (
        lambda f: _edit_config(f, model_type="t5"),
        "no model family reads Hugging Face model_type 't5'",
    ),
    "remote code": (
        lambda f: _edit_config(f, auto_map={"AutoModelForCausalLM": "modeling_mine.MyModel"}),
        "config.json asks for the folder's own code (auto_map)",
    ),
    "damaged weights": (lambda f: _truncate(f / "model.safetensors"), "model.safetensors is damaged (SafetensorError"),
    "no weights": (lambda f: (f / "model.safetensors").unlink(), "holds no weights (model.safetensors)"),
    "pickled weights": (
        lambda f: (f / "model.safetensors").rename(f / "pytorch_model.bin"),
        "holds pytorch_model.bin but no model.safetensors: glmc reads safetensors weights only",
    ),
    "foreign class": (
        lambda f: _edit_config(f, architectures=["GPT2DoubleHeadsModel"]),
        "its config.json's architectures ['GPT2DoubleHeadsModel'] are none of the classes the gpt2 family converts",
    ),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_folder_that_cannot_be_used_is_refused_naming_it(damage, folders, tmp_path):
    good = folders("gpt2", "a")
    bad = _copy(good, tmp_path, "bad")
    do, message = DAMAGE[damage]
    do(bad)
    with pytest.raises(ConfigError, match=re.escape(f"endpoints.paths[1]={bad}: {message}")):
        validate_config(pretrained([good, bad], "data=pydoc", f"data.seq_len={SEQ_LEN}"))


def test_models_that_do_not_fit_together_or_the_data_are_refused(folders, tmp_path):
    a, vit = folders("gpt2", "a"), folders("vit", "a")
    other_vocab = folders("gpt2", "vocab", vocab_size=150)
    text = ("data=pydoc", f"data.seq_len={SEQ_LEN}")
    refusals = [
        ([a, other_vocab], text, f"endpoints.paths[1]={other_vocab} has a vocabulary of 150 tokens"),
        ([a, folders("gpt2", "deep", num_layers=2)], text, "has 2 layers, endpoints.paths[0]="),
        ([a, vit], text, f"endpoints.paths[1]={vit} is a vit model (ViTForImageClassification) for images"),
        ([a, a], text, f"endpoints.paths[1]={a} is endpoints.paths[0] again"),
        ([a], text, "endpoints.paths=["),
        ([a, folders("gpt2", "b", seed=1)], ("data=pydoc", "data.seq_len=64"), "has 16 positions, fewer than the "),
        ([vit, folders("vit", "b", seed=1)], ("data=cifar10",), "reads images of 1 channels, data=cifar10's have 3"),
        ([a, folders("gpt2", "b", seed=1)], (*text, "pairing=universe"), "pairing=universe aligns three or more"),
    ]
    for paths, overrides, message in refusals:
        with pytest.raises(ConfigError, match=re.escape(message)):
            validate_config(pretrained(paths, *overrides))
    # trained endpoints take no folders
    with pytest.raises(ConfigError, match=re.escape("model folders are read with endpoints=pretrained only")):
        validate_config(compose_config(f"endpoints.paths=[{a}]"))


def test_what_only_the_weights_show_is_refused_when_they_are_loaded(folders, tmp_path):
    # the same widths but other MLP widths: vanilla cannot take them
    a, wide_mlp = folders("gpt2", "a"), folders("gpt2", "mlp", mlp_size=48)
    with pytest.raises(
        FolderError, match=re.escape(f"endpoints.paths[1]={wide_mlp} and endpoints.paths[0]={a} differ")
    ):
        load_endpoints(pretrained([a, wide_mlp], "data=pydoc", f"data.seq_len={SEQ_LEN}"), evaluator=None)
    relu = folders("gpt2", "relu", hidden_act="relu")
    with pytest.raises(FolderError, match="do not fit together: model_b has activation relu"):
        load_endpoints(pretrained([a, relu], "data=pydoc", f"data.seq_len={SEQ_LEN}"), evaluator=None)
    # a classifier folder whose weights are a masked-LM's: the classifier's weights would start at random
    mlm = _copy(folders("bert", "a"), tmp_path, "bert_as_classifier")
    _edit_config(mlm, architectures=["BertForSequenceClassification"])
    with pytest.raises(FolderError, match=re.escape(f"endpoints.paths[0]={mlm}: its weights lack")):
        load_model(read_folder(str(mlm), 0, "classification"))


def test_the_text_is_encoded_with_the_folders_tokenizer(folders, tmp_path):
    """The first folder's tokenizer unless data.tokenizer_path names another; a tokenizer with more ids
    than the models' vocabulary is refused naming the folder."""
    from glmc.data.module import DataModule
    from glmc.data.text import saved_tokenizer
    from glmc.pipeline.folder_fit import check_tokenizer
    from glmc.pipeline.hf_folders import evaluation_config

    a, b = folders("gpt2", "a"), folders("gpt2", "b", seed=1)
    text = ("data=pydoc", f"data.seq_len={SEQ_LEN}")
    data = evaluation_config(pretrained([a, b], *text)).data
    assert (data.tokenizer, data.tokenizer_path) == ("pretrained", str(a))
    module = DataModule(data)
    module.setup()
    assert module.vocab_size == len(char_tokenizer())
    small = folders("gpt2", "small", vocab_size=50)
    other = pretrained([small, folders("gpt2", "small_b", seed=1, vocab_size=50)], *text, f"data.tokenizer_path={a}")
    assert evaluation_config(other).data.tokenizer_path == str(a)
    with pytest.raises(FolderError, match=re.escape(f"endpoints.paths[0]={small} has a vocabulary of 50 tokens")):
        check_tokenizer(other, module.vocab_size)
    # a tokenizer that asks for code of its own is never loaded
    remote = _copy(a, tmp_path, "remote_tokenizer")
    settings = json.loads((remote / "tokenizer_config.json").read_text())
    (remote / "tokenizer_config.json").write_text(
        json.dumps({**settings, "auto_map": {"AutoTokenizer": ["x.T", None]}})
    )
    with pytest.raises(ValueError, match=re.escape(f"data.tokenizer_path={remote}: its tokenizer_config.json asks")):
        saved_tokenizer(remote)
