"""Model folders given as endpoints (endpoints=pretrained) and what the run says about them: a tied model
pairs with an untied one, a non-ASCII list of folders gets a quoting that Hydra reads as the list, a
tokenizer asking for its own code is named by the folder that holds it, a tokenizer built from the
corpus is refused by name, and an unknown rotary type is refused before any weight is loaded."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import shutil

import pytest
import torch
from hydra.core.override_parser.overrides_parser import OverridesParser
from test_pretrained_endpoints import FAST, SEQ_LEN, TINY, char_tokenizer, pretrained
from transformers import GPT2LMHeadModel

from glmc.eval.evaluator import evaluate_path
from glmc.interpolation import interpolate_state_dicts
from glmc.models.build import build_model
from glmc.models.families.llama import unread_rope_type
from glmc.pipeline.endpoints import load_endpoints
from glmc.pipeline.hf_folders import FolderError, head_is_tied, read_folder
from glmc.pipeline.refusals import unquoted_override_problem
from glmc.pipeline.validate import ConfigError, validate_config

from conftest import run_script
from tiny_hf import tiny_llama

TEXT = ("data=pydoc", f"data.seq_len={SEQ_LEN}")


class _NoEvaluation:
    """Stands in for the run's evaluator: the endpoints' losses are not what these tests look at."""

    def evaluate(self, model):
        return 0.0, 0.0


@pytest.fixture(scope="module")
def gpt2_folders(tmp_path_factory):
    """{"tied_a", "tied_b", "untied"}: tiny GPT-2 folders beside the character tokenizer; the untied one
    (as a weight-matching export is written) has an lm_head of its own."""
    root, tokenizer, out = tmp_path_factory.mktemp("gpt2"), char_tokenizer(), {}
    for seed, name in enumerate(("tied_a", "tied_b", "untied")):
        torch.manual_seed(seed)
        model = build_model(dataclasses.replace(TINY, family="gpt2", vocab_size=len(tokenizer)))
        if name == "untied":
            model.config.tie_word_embeddings = False
            model = GPT2LMHeadModel(model.config)
            assert not head_is_tied(model)
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
        out[name] = root / name
    return out


def _copy(folder, tmp_path, name):
    return shutil.copytree(folder, tmp_path / name)


@pytest.mark.parametrize("order", [("tied_a", "untied"), ("untied", "tied_a")])
def test_a_tied_folder_is_untied_to_pair_with_an_untied_one(order, gpt2_folders):
    paths = [gpt2_folders[name] for name in order]
    originals = [GPT2LMHeadModel.from_pretrained(p).eval() for p in paths]
    endpoints = load_endpoints(pretrained(paths, *TEXT), _NoEvaluation())
    tied = order.index("tied_a")
    assert head_is_tied(originals[tied]) and not any(head_is_tied(e.model) for e in endpoints)
    untied = endpoints[tied].model
    assert torch.equal(untied.lm_head.weight, originals[tied].transformer.wte.weight)
    ids = torch.randint(0, untied.config.vocab_size, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(untied(ids).logits, originals[tied](ids).logits)  # the same function
    # the original models are interpolated parameter by parameter (vanilla): both now have every name
    sds = [dict(e.model.named_parameters()) for e in endpoints]
    assert "lm_head.weight" in sds[0] and "lm_head.weight" in sds[1]
    interpolate_state_dicts(sds, [0.5, 0.5])
    batch = [(ids[:, :-1], ids[:, 1:])]
    curve = evaluate_path(endpoints[0].model, endpoints[1].model, batch, [0.0, 0.5, 1.0], "causal_lm", progress=False)
    assert all(torch.isfinite(torch.tensor(curve["loss"])))


def test_folders_that_agree_on_tying_keep_it(gpt2_folders):
    paths = [gpt2_folders["tied_a"], gpt2_folders["tied_b"]]
    endpoints = load_endpoints(pretrained(paths, *TEXT), _NoEvaluation())
    assert all(head_is_tied(e.model) for e in endpoints)


def _suggested_argument(problem: str) -> str:
    """The one shell word the message suggests typing instead."""
    suggestion = re.search(r"e\.g\. (.+) \(the outer quotes", problem).group(1)
    words = shlex.split(suggestion)
    assert len(words) == 1, suggestion
    return words[0]


@pytest.mark.parametrize(
    ("arg", "intended"),
    [
        ("endpoints.paths=[/a/é,/b/ü]", ["/a/é", "/b/ü"]),
        ("endpoints.paths=[/d/it's é,/b/ü]", ["/d/it's é", "/b/ü"]),
        ("data.path=/x/é", "/x/é"),
    ],
)
def test_the_quoting_suggested_for_an_unquoted_override_reads_as_the_value_meant(arg, intended):
    problem = unquoted_override_problem(arg)
    assert problem is not None
    suggested = _suggested_argument(problem)
    override = OverridesParser.create().parse_overrides([suggested])[0]
    assert override.key_or_group == arg.partition("=")[0]
    assert override.value() == intended
    if isinstance(intended, list):
        assert "each element of the list" in problem


def _with_tokenizer_code(folder, tmp_path, name):
    copy = _copy(folder, tmp_path, name)
    config_file = copy / "tokenizer_config.json"
    content = json.loads(config_file.read_text())
    content["auto_map"] = {"AutoTokenizer": ["tokenization_own.OwnTokenizer", None]}
    config_file.write_text(json.dumps(content))
    return copy


@pytest.mark.parametrize("which", [0, 1])
def test_a_folder_tokenizer_asking_for_code_is_named_by_its_folder(which, gpt2_folders, tmp_path):
    paths = [gpt2_folders["tied_a"], gpt2_folders["tied_b"]]
    paths[which] = _with_tokenizer_code(paths[which], tmp_path, "own_code")
    with pytest.raises(ConfigError) as refused:
        validate_config(pretrained(paths, *TEXT))
    message = str(refused.value)
    assert (
        f"endpoints.paths[{which}]={paths[which]}: its tokenizer_config.json asks for the folder's own code" in message
    )
    assert "data.tokenizer_path=" + str(paths[which]) not in message  # the user never set it
    assert "set data.tokenizer_path=<folder>" in message  # what to do instead


def test_a_char_tokenizer_asked_for_with_folders_is_refused_by_name(gpt2_folders, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    paths = f"endpoints.paths=[{gpt2_folders['tied_a']},{gpt2_folders['tied_b']}]"
    common = ("endpoints=pretrained", paths, *TEXT, *FAST, f"hydra.run.dir={tmp_path / 'run'}")
    code, _, err = run_script(monkeypatch, capsys, *common, "data.tokenizer=char")
    assert code == 1 and "Traceback" not in err
    assert "data.tokenizer=char: builds its ids from the corpus" in err
    assert "leave data.tokenizer unset" in err and "data.tokenizer_path=<folder>" in err
    assert not (tmp_path / "run" / "results.json").exists()
    # data=pydoc's own default (char) is not the user's choice: the folders' tokenizer reads the text
    validate_config(pretrained([gpt2_folders["tied_a"], gpt2_folders["tied_b"]], *TEXT))


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama") / "llama"
    tiny_llama(hidden=16, heads=2, kv_heads=1, mlp=16, layers=1).save_pretrained(folder)
    return folder


def _with_rope(folder, tmp_path, key, params):
    copy = _copy(folder, tmp_path, "rope")
    config = json.loads((copy / "config.json").read_text())
    config.pop("rope_parameters", None)
    config[key] = params
    (copy / "config.json").write_text(json.dumps(config))
    (copy / "model.safetensors").write_bytes(b"")  # never read: the rotary type is refused first
    return copy


@pytest.mark.parametrize("key", ["rope_scaling", "rope_parameters"])
def test_an_unknown_rope_type_is_refused_by_key_before_loading(key, llama_folder, tmp_path):
    folder = _with_rope(llama_folder, tmp_path, key, {"rope_type": "bogus", "factor": 2.0, "rope_theta": 100.0})
    with pytest.raises(FolderError) as refused:
        read_folder(str(folder), 0, "causal_lm")
    message = str(refused.value)
    assert message.startswith(f"endpoints.paths[0]={folder}: its config.json names the rotary type {key}.rope_type=")
    assert "'bogus'" in message and "default, linear, dynamic, yarn, llama3" in message
    assert "KeyError" not in message


def test_the_rope_types_glmc_reads_pass(llama_folder, tmp_path):
    folder = _with_rope(llama_folder, tmp_path, "rope_scaling", {"rope_type": "linear", "factor": 2.0})
    with pytest.raises(FolderError, match="model.safetensors is damaged"):  # past the rotary type, to the weights
        read_folder(str(folder), 0, "causal_lm")
    assert unread_rope_type({"rope_scaling": {"type": "yarn", "factor": 2.0}}) is None
    assert unread_rope_type({"rope_scaling": {"type": "longrope"}}) == ("rope_scaling.type", "longrope")
    assert unread_rope_type({"model_type": "gpt2"}) is None
