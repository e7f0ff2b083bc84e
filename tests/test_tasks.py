"""Task scores along paths (eval.tasks; glmc.eval.tasks): glmc's lm-eval model scores what lm-eval's own
HFLM scores, a path's ends score what the endpoints score, task files and unknown names, and a run's
records, files and exported model cards."""

from __future__ import annotations

import json

import pytest
import torch
from lm_eval.api.instance import Instance
from lm_eval.models.huggingface import HFLM
from tokenizers import Regex, models, pre_tokenizers
from tokenizers import Tokenizer as Fast
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

import glmc
from glmc.data.lm_eval_tasks import SHIPPED, TEMPLATE, next_chars_examples
from glmc.data.pydoc_corpus import pydoc_text
from glmc.data.text import CharTokenizer, HFTokenizer
from glmc.eval.task_lm import ModelLM
from glmc.eval.tasks import TaskSuite, task_barrier
from glmc.pipeline.run import run_pipeline

from conftest import compose_config
from tiny_hf import tiny_gpt2


@pytest.fixture(scope="module")
def char_pair():
    """Two tiny character-level GPT-2s of the pydoc corpus's characters and its tokenizer."""
    tokenizer = CharTokenizer(pydoc_text())
    pair = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        sizes = {"n_positions": 80, "n_embd": 16, "n_layer": 1, "n_head": 2}
        config = GPT2Config(vocab_size=tokenizer.vocab_size, bos_token_id=None, eos_token_id=None, **sizes)
        pair.append(GPT2LMHeadModel(config).eval())
    return tokenizer, pair


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    return tmp_path_factory.mktemp("tasks")


def _instance(kind, args, i):
    return Instance(request_type=kind, doc={}, arguments=args, idx=i)


@pytest.mark.numeric
def test_model_lm_scores_what_lm_evals_hflm_scores():
    model = tiny_gpt2(seed=3, hidden=16, heads=2, layers=1)  # 97 ids, 16 positions, id 0 ends a text
    chars = [chr(c) for c in range(32, 128)]
    fast = Fast(models.WordLevel(vocab={"<eos>": 0, **{c: i + 1 for i, c in enumerate(chars)}}, unk_token="<eos>"))
    fast.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    hf = PreTrainedTokenizerFast(tokenizer_object=fast, eos_token="<eos>")
    ours, theirs = ModelLM(model, HFTokenizer(hf), 16, batch_size=3), HFLM(pretrained=model, tokenizer=hf, batch_size=3)
    pairs = [("abc", "de"), ("the quick brown fox jumps", " over"), ("x", "y"), ("", "start"), ("zz top", " z")]
    requests = [_instance("loglikelihood", p, i) for i, p in enumerate(pairs)]
    for (mine, greedy), (reference, their_greedy) in zip(ours.loglikelihood(requests), theirs.loglikelihood(requests)):
        assert mine == pytest.approx(reference, rel=1e-5, abs=1e-5) and greedy == their_greedy
    rolling = [_instance("loglikelihood_rolling", ("a text longer than sixteen characters, in windows",), 0)]
    assert ours.loglikelihood_rolling(rolling)[0] == pytest.approx(theirs.loglikelihood_rolling(rolling)[0], rel=1e-5)
    generating = [_instance("generate_until", ("abc", {"until": ["\n"], "max_gen_toks": 4, "do_sample": False}), 0)]
    assert ours.generate_until(generating) == theirs.generate_until(generating)  # greedy, as HFLM's


def test_the_path_ends_score_what_the_endpoints_score(char_pair, shipped):
    tokenizer, (a, b) = char_pair
    record = glmc.evaluate_tasks(a, b, list(SHIPPED), tokenizer, [0.0, 0.5, 1.0], limit=12, task_folder=shipped)
    for task in SHIPPED:
        curve = record["tasks"][task]["acc"]
        assert len(curve["values"]) == 3 and all(0 <= v <= 1 for v in curve["values"])
        assert curve["values"][-1] == record["endpoints"]["A"][task]["acc"]["value"]  # lambda = 1 is A
        assert curve["values"][0] == record["endpoints"]["B"][task]["acc"]["value"]
        assert curve["stderr"][0] == record["endpoints"]["B"][task]["acc"]["stderr"] >= 0
    # a canonical path (weight matching; B aligned) ends at A's canonical form: A's own scores through lm-eval
    aligned = glmc.evaluate_tasks(glmc.align(a, b, "weight"), None, ["pydoc_next_chars"], tokenizer, [1.0],
                                  max_length=80, limit=12, task_folder=shipped, progress=False)  # fmt: skip
    assert aligned["tasks"]["pydoc_next_chars"]["acc"]["values"] == [
        record["endpoints"]["A"]["pydoc_next_chars"]["acc"]["value"]
    ]


def test_a_task_file_is_scored_and_bad_names_are_refused(char_pair, shipped, tmp_path):
    tokenizer, (a, _) = char_pair
    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps(e) + "\n" for e in next_chars_examples()[:5]))
    task = tmp_path / "mine.yaml"
    task.write_text(TEMPLATE.format(name="my_next_chars", data=json.dumps(str(data)), version=1))
    scores = TaskSuite([str(task)], shipped).score(a, tokenizer, 80)
    assert list(scores) == ["my_next_chars"] and 0 <= scores["my_next_chars"]["acc"]["value"] <= 1
    with pytest.raises(FileNotFoundError, match=r"eval.tasks\[0\]=.*nothere.yaml: no such task file"):
        TaskSuite([str(tmp_path / "nothere.yaml")], shipped)
    with pytest.raises(ValueError, match="eval.tasks is empty"):
        TaskSuite([], shipped)


def test_a_barrier_is_the_drop_below_the_line_between_the_end_scores():
    high = task_barrier([0.0, 0.5, 1.0], [0.6, 0.3, 0.8], [0.1, 0.2, 0.1], higher_is_better=True)
    assert high["barrier"] == pytest.approx(0.4) and high["at_lambda"] == 0.5
    assert high["barrier_stderr"] == pytest.approx((0.2**2 + 0.05**2 + 0.05**2) ** 0.5)
    low = task_barrier([0.0, 0.5, 1.0], [2.0, 3.0, 2.0], [None] * 3, higher_is_better=False)
    assert low["barrier"] == pytest.approx(1.0) and low["barrier_stderr"] is None


FAST_TEXT = ("experiment=demo_text", "debug=fast", "logger=none", "matcher.methods=[vanilla,weight]")


def test_an_unknown_task_is_refused_before_any_training(tmp_path):
    cfg = compose_config(*FAST_TEXT, f"cache_dir={tmp_path / 'cache'}", "eval.tasks=[pydoc_next_chars,hellaswagg]")
    with pytest.raises(ValueError, match=r"lm-eval knows no task 'hellaswagg' \(did you mean hellaswag"):
        run_pipeline(cfg, tmp_path / "run")
    assert not list((tmp_path / "cache").rglob("*.safetensors")) and not list((tmp_path / "cache").rglob("*.ckpt"))


def test_a_run_records_task_barriers_and_cards_its_exports(tmp_path, capsys):
    tasks = ["eval.tasks=[pydoc_next_chars,pydoc_topic_choice]", "eval.task_limit=6"]
    export = ["merge.export=true", "merge.export_max_shard=20KB"]
    cfg = compose_config(*FAST_TEXT, f"cache_dir={tmp_path / 'cache'}", *tasks, *export)
    results = run_pipeline(cfg, tmp_path / "run")
    run = tmp_path / "run"
    for method in ("vanilla", "weight"):
        pair = results["methods"][method]["pairs"][0]
        record = pair["tasks"]
        curve = record["tasks"]["pydoc_next_chars"]["acc"]
        assert record["lambdas"] == pair["lambdas"] and len(curve["values"]) == len(pair["lambdas"])
        assert curve["barrier"] >= 0 and (run / record["figure"]).exists()
        assert (
            results["tasks"][method]["pydoc_topic_choice/acc"]["values"]
            == (record["tasks"]["pydoc_topic_choice"]["acc"]["values"])
        )
        # vanilla's path is the original models: its ends are the endpoints' own scores
        if method == "vanilla":
            assert curve["values"][-1] == record["endpoints"]["A"]["pydoc_next_chars"]["acc"]["value"]
            assert curve["values"][0] == record["endpoints"]["B"]["pydoc_next_chars"]["acc"]["value"]
        if method != "vanilla" and not pair["export"]["exported"]:  # e.g. a stream map off the mean-zero plane
            continue
        folder = run / method / "hf_0-1"
        card = (folder / "README.md").read_text()
        assert card.startswith("---\nlibrary_name: transformers\n") and f"`{method}`" in card
        assert "| pydoc_next_chars | acc |" in card and f"glmc {glmc_version()}" in card
        assert (folder / "model.safetensors.index.json").exists()  # sharded at 20 KB, and reloaded as checked
        assert pair["export"]["exported"] and pair["export"]["relative_deviation"] < 1e-5
    header = (run / "barrier.csv").read_text().splitlines()[0]
    assert header.endswith("pydoc_next_chars/acc,pydoc_topic_choice/acc") and (run / "tasks.png").exists()
    assert "task barriers (lm-evaluation-harness" in capsys.readouterr().out


def glmc_version() -> str:
    from glmc.pipeline.model_card import glmc_version as version

    return version()


def test_run_py_scores_tasks_on_two_users_llama_folders(monkeypatch, capsys, tmp_path):
    from family_checks import cli_on_two_folders

    tasks = ("eval.tasks=[pydoc_next_chars]", "eval.task_limit=4")
    results = cli_on_two_folders(monkeypatch, capsys, tmp_path, "llama", extra=tasks)  # their own tokenizer
    for method in ("vanilla", "weight"):
        record = results["methods"][method]["pairs"][0]["tasks"]
        curve = record["tasks"]["pydoc_next_chars"]["acc"]
        assert curve["values"][-1] == record["endpoints"]["A"]["pydoc_next_chars"]["acc"]["value"]
    card = (tmp_path / "run" / "vanilla" / "hf_llama_0-llama_1" / "README.md").read_text()
    assert "base_model:" in card and "llama_0" in card and "| pydoc_next_chars | acc |" in card
    assert "- model: LlamaForCausalLM; data: pydoc" in card


def test_an_endpoints_scores_follow_its_model_not_its_seed(char_pair, tmp_path):
    from types import SimpleNamespace

    from glmc.alignment import Alignment
    from glmc.pipeline.tasks_run import task_record

    tokenizer, (a, b) = char_pair
    tasks = ("eval.tasks=[pydoc_next_chars]", "eval.task_limit=12", "data.seq_len=64")
    cfg = compose_config(*FAST_TEXT, f"cache_dir={tmp_path / 'cache'}", *tasks)
    run = SimpleNamespace(cfg=cfg, data=SimpleNamespace(tokenizer=tokenizer), lambdas=[0.0, 1.0], device="cpu")
    run.run_dir = tmp_path / "run"
    records = []
    for first, second in ((a, b), (b, a)):  # the same seeds, other models: a series' next step
        ends = (SimpleNamespace(name=None, seed=0, model=first), SimpleNamespace(name=None, seed=1, model=second))
        records.append(task_record(run, "vanilla", "0-1", Alignment(first, second), ends))
    for record in records:
        curve = record["tasks"]["pydoc_next_chars"]["acc"]["values"]
        assert curve == [record["endpoints"][end]["pydoc_next_chars"]["acc"]["value"] for end in "BA"]
    # seed 0's scores in the second record are those computed for its model (b), not the first seed 0's (a)
    assert records[1]["endpoints"]["A"] is records[0]["endpoints"]["B"]
    assert records[1]["endpoints"]["B"] is records[0]["endpoints"]["A"]
