"""Your own text (data=text_file data.path=...): one command gives a barrier on a UTF-8 file of yours, read
with the folders' saved tokenizer and cut into train / validation / test windows like every text dataset;
a file that cannot be used, and a run with no tokenizer to read it, are refused naming data.path."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil
from pathlib import Path

import pytest
import torch
from omegaconf import open_dict
from test_pretrained_endpoints import FAST, TINY, char_tokenizer, pretrained

from glmc.data.module import DataModule
from glmc.data.pydoc_corpus import pydoc_text
from glmc.data.text import CharTokenizer, HFTokenizer, split_text
from glmc.models.build import build_model
from glmc.pipeline import outputs
from glmc.pipeline.endpoints import cache_key
from glmc.pipeline.hf_folders import evaluation_config
from glmc.pipeline.outputs import config_as_saved
from glmc.pipeline.refusals import is_refusal
from glmc.pipeline.run_folder import config_differences
from glmc.pipeline.validate import ConfigError, validate_config

from conftest import compose_config, run_script

SEQ = 16
OWN = ("data=text_file", f"data.seq_len={SEQ}")


def own_text() -> str:
    """About 2,000 characters: the corpus the test tokenizer was built on, and a line of characters it
    has no id for (read as its unknown token)."""
    return pydoc_text()[:1900] + "\nnaïve café, ünïcode ✓\n" * 4


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    """(text file, folder a, folder b): a tiny Llama pair saved with save_pretrained beside the character
    tokenizer, and a UTF-8 file written here."""
    root, tokenizer = tmp_path_factory.mktemp("own_text"), char_tokenizer()
    file = root / "notes.txt"
    file.write_text(own_text(), encoding="utf-8")
    folders = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        folder = root / f"llama_{seed}"
        build_model(dataclasses.replace(TINY, family="llama", vocab_size=len(tokenizer))).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        folders.append(folder)
    return file, *folders


@pytest.fixture
def no_plot(monkeypatch):
    """barrier.png is drawn by its own tests; here an empty file stands in for it (a second saved per run)."""
    monkeypatch.setattr(outputs, "plot_barrier_curves", lambda curves, path, title: Path(path).write_bytes(b""))


def with_path(cfg, path, **data):
    """`cfg` with data.path=`path` and the other data settings `data` (no second composition)."""
    with open_dict(cfg):
        cfg.data.path = None if path is None else str(path)
        for key, value in data.items():
            cfg.data[key] = value
    return cfg


def own_config(paths, path, *overrides: str, **data):
    """An endpoints=pretrained run of the folders `paths` on the file `path`, composed once per list of
    `overrides` (composing takes Hydra a good part of a second): the folders and the file are set on a copy."""
    cfg = pretrained(["a", "b"], *OWN, *overrides)
    with open_dict(cfg):
        cfg.endpoints.paths = [str(p) for p in paths]
    return with_path(cfg, path, **data)


def trained(path, **data):
    """A run whose endpoints are trained here from seeds, on the file `path`."""
    return with_path(compose_config("debug=fast", "logger=none", "model=llama_text", *OWN), path, **data)


def test_one_command_gives_a_barrier_on_your_own_text(own, tmp_path, monkeypatch, capsys, no_plot):
    file, a, b = own
    run = tmp_path / "run"
    args = ("endpoints=pretrained", f"endpoints.paths=[{a},{b}]", *OWN, f"data.path={file}", "matcher.methods=[weight]")
    code, out, err = run_script(monkeypatch, capsys, *FAST, *args, f"hydra.run.dir={run}")
    assert code == 0, err[-3000:]
    results = json.loads((run / "results.json").read_text())
    assert results["dataset"] == "text_file" and results["config"]["data"]["path"] == str(file)
    assert all(math.isfinite(e["test_loss"]) for e in results["endpoints"])
    assert math.isfinite(results["methods"]["weight"]["barrier"]) and "weight" in out


def test_the_file_is_cut_into_windows_read_with_the_folders_tokenizer(own):
    file, a, b = own
    data = evaluation_config(own_config([a, b], file)).data
    data.limit_train = data.limit_test = None  # every window
    assert (data.tokenizer, data.tokenizer_path) == ("pretrained", str(a))
    module = DataModule(data)
    module.setup()
    assert isinstance(module.tokenizer, HFTokenizer) and module.vocab_size == len(char_tokenizer())
    blocks = split_text(own_text(), data.val_fraction, data.test_fraction)
    for block, split in zip(blocks, (module.train_set, module.val_set, module.test_set)):
        ids = torch.tensor(module.tokenizer.encode(block))
        windows = torch.stack([split[i][0] for i in range(len(split))])
        assert torch.equal(windows, ids[: len(split) * SEQ].view(-1, SEQ))
        assert len(split) == len(ids) // SEQ >= 1
    unknown = module.tokenizer.hf.unk_token_id
    assert unknown in module.test_set.windows  # "ï", "✓": read as the unknown token, not dropped


def test_a_file_that_cannot_be_used_is_refused_naming_data_path(own, tmp_path):
    file, a, b = own
    cases = {
        tmp_path / "absent.txt": "no such file",
        tmp_path: "is not a file",
        None: "data=text_file reads your own UTF-8 text file: set data.path=<file>",
    }
    for path, problem in cases.items():
        named = "" if path is None else f"data.path={path}"
        with pytest.raises(ConfigError, match=re.escape(named) + ".*" + re.escape(problem)):
            validate_config(own_config([a, b], path))
    latin = tmp_path / "latin1.txt"
    latin.write_bytes(own_text().replace("ï", "i").encode("utf-8") + "café".encode("latin-1"))
    short = tmp_path / "short.txt"
    short.write_text(own_text()[:200], encoding="utf-8")
    for path, problem in ((latin, "is not UTF-8 text: byte 0xe9"), (short, "is too short: 200 characters")):
        cfg = own_config([a, b], path)
        validate_config(cfg)  # found when the file is read, before any model is
        with pytest.raises(ValueError, match=re.escape(f"data.path={path} {problem}")) as refused:
            DataModule(evaluation_config(cfg).data).setup()
        assert is_refusal(refused.value)  # run.py prints the message alone and exits with status 1


def test_a_run_without_a_tokenizer_is_refused_saying_which_it_needs(own, tmp_path):
    file, a, b = own
    with pytest.raises(ConfigError) as refused:
        validate_config(trained(file))
    message = str(refused.value)
    for needed in (f"data=text_file reads data.path={file} with a saved tokenizer", "data.tokenizer_path=<a folder"):
        assert needed in message
    assert "data.tokenizer=char on purpose" in message and message.count("data.tokenizer=pretrained") == 0
    # characters only when asked for: the file's own, one id each
    chars = trained(file, tokenizer="char")
    validate_config(chars)
    module = DataModule(chars.data)
    module.setup()
    assert isinstance(module.tokenizer, CharTokenizer) and module.vocab_size == len(set(own_text()))
    # folders saved without their tokenizer
    bare = []
    for folder in (a, b):
        bare.append(tmp_path / f"bare_{folder.name}")
        bare[-1].mkdir()
        for name in ("config.json", "model.safetensors"):
            shutil.copy(folder / name, bare[-1] / name)
    with pytest.raises(
        ConfigError, match=re.escape(f"the tokenizer saved in endpoints.paths[0]={bare[0]}, which holds none")
    ):
        validate_config(own_config(bare, file))
    validate_config(own_config(bare, file, tokenizer_path=str(a)))  # named on purpose


def test_data_path_belongs_to_text_file_only(own):
    file, a, b = own
    with pytest.raises(ConfigError, match=re.escape(f"data.path={file}: data=pydoc does not read it")):
        validate_config(own_config([a, b], file, name="pydoc"))


def test_the_file_enters_the_cache_key_by_content_not_by_place(own, tmp_path):
    file = own[0]
    same, other = tmp_path / "moved.txt", tmp_path / "edited.txt"
    shutil.copy(file, same)
    other.write_text(own_text().replace("the", "tha"), encoding="utf-8")
    key = lambda path: cache_key(trained(path, tokenizer="char"))  # noqa: E731
    assert key(file) == key(same) and key(file) != key(other)
    # results recorded before data.path existed are the same config with no file
    current = config_as_saved(trained(None))
    saved = json.loads(json.dumps(current))
    del saved["data"]["path"]
    assert config_differences(saved, current) == []
