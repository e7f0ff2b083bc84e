"""The public API takes a list of batches for every data-driven matcher and refuses a generator it would read
only once; refuses a run_dir that is a file, non-finite interpolation weights and lambdas, and models wrapped
for parallel training, each by name before any work; and pairs a tied output head with an untied one, as a
run does, without changing the models passed in."""

from __future__ import annotations

import copy
import math
import re

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel
from transformers import GPT2LMHeadModel

import glmc.api
from glmc import align, evaluate, evaluate_path, interpolate, to_canonical

from tiny_hf import inputs_for, tiny_gpt2, tiny_vit

TRAINER = {"accelerator": "cpu", "enable_progress_bar": False}
LEARNED = dict(max_steps=3, lr=0.01, checkpoint_every=2)


def _vits():
    return tiny_vit(seed=0, hidden=16, heads=2, mlp=32), tiny_vit(seed=1, hidden=16, heads=2, mlp=32)


def _images(n=16):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g)


@pytest.mark.parametrize("name", ["learned", "activation"])
def test_a_list_or_tuple_of_batches_is_data_for_learned_and_activation_matching(name, tmp_path):
    a, b = _vits()
    x, y = _images()
    if name == "learned":  # three steps over one batch: the list is read again at every epoch
        result = align(a, b, name, data=[(x, y)], trainer=TRAINER, run_dir=tmp_path, **LEARNED)
        assert result.diagnostics["steps"] == 3
    else:
        result = align(a, b, name, data=((x[:8], y[:8]), (x[8:], y[8:])), trainer=TRAINER)
    assert torch.isfinite(result.model(x)).all()


def test_a_generator_of_batches_is_refused_naming_data_before_any_batch_is_read(tmp_path):
    a, b = _vits()
    x, y = _images()
    for name in ("learned", "activation", "weight"):
        batches = (batch for batch in [(x, y)])
        with pytest.raises(TypeError, match="^data is a generator, which yields its batches only once") as err:
            align(a, b, name, data=batches, trainer=TRAINER, run_dir=tmp_path, **(LEARNED if name == "learned" else {}))
        assert "list(data)" in str(err.value)
        assert next(batches)[0] is x  # nothing was read from it


def test_a_run_dir_that_is_a_file_is_refused_naming_it_before_the_models_are_converted(tmp_path, monkeypatch):
    a, b = _vits()
    file = tmp_path / "notes.txt"
    file.write_text("kept")

    def converted(*args):
        raise AssertionError("the models were converted before run_dir was checked")

    monkeypatch.setattr(glmc.api, "_convert", converted)
    where = re.escape(str(file))
    with pytest.raises(ValueError, match=f"^run_dir='{where}' is a file, not a folder: pass run_dir=<a folder"):
        align(a, b, "learned", data=[_images()], run_dir=file, **LEARNED)
    with pytest.raises(ValueError, match=f"^run_dir='{where}/match' cannot be created: {where} is a file"):
        align(a, b, "weight", run_dir=file / "match")
    assert file.read_text() == "kept"


def test_non_finite_interpolation_weights_are_refused_naming_the_weight():
    a, b = tiny_gpt2(0), tiny_gpt2(1)
    for models in ([a, b], [to_canonical(a), to_canonical(b)]):
        with pytest.raises(ValueError, match=r"^weights\[0\]=nan is not a finite number"):
            interpolate(models, [math.nan, 0.5])
        with pytest.raises(ValueError, match=r"^weights\[1\]=inf is not a finite number"):
            interpolate(models, [0.5, math.inf])
        with pytest.raises(TypeError, match=r"^weights\[1\]='half' is not a number"):
            interpolate(models, [0.5, "half"])
    aligned = align(a, b, "weight", max_iter=2)
    with pytest.raises(ValueError, match=r"^weights\[0\]=nan"):
        aligned.interpolate(math.nan)
    assert torch.isfinite(interpolate([a, b], [0.5, 0.5])(inputs_for(a)).logits).all()


class _Unread(list):
    """Batches that must not be read: the lambdas are checked first."""

    def __iter__(self):
        raise AssertionError("a batch was read before the lambdas were checked")


def test_lambdas_outside_zero_to_one_or_nan_are_refused_before_any_batch_is_read():
    a, b = tiny_gpt2(0), tiny_gpt2(1)
    aligned = align(a, b, "weight", max_iter=2)
    for ends in ((a, b), (aligned, None)):
        with pytest.raises(ValueError, match=r"^lambdas\[1\]=nan is not a number: pass lambdas in \[0, 1\]"):
            evaluate_path(*ends, _Unread(), [0.5, math.nan], progress=False)
        with pytest.raises(ValueError, match=r"^lambdas\[0\]=1.5 is outside \[0, 1\]: pass lambdas in"):
            evaluate_path(*ends, _Unread(), [1.5], progress=False)
        with pytest.raises(TypeError, match=r"^lambdas=0.5 is not a sequence of numbers: pass e.g. \[0.0, 0.5"):
            evaluate_path(*ends, _Unread(), 0.5, progress=False)


def _ddp(model):
    wrapper = DistributedDataParallel.__new__(DistributedDataParallel)  # no process group needed to refuse it
    torch.nn.Module.__init__(wrapper)
    wrapper.module = model
    return wrapper


@pytest.mark.parametrize("wrap", [torch.nn.DataParallel, _ddp], ids=["DataParallel", "DistributedDataParallel"])
def test_a_model_wrapped_for_parallel_training_is_refused_naming_the_argument_and_module(wrap):
    a, b = tiny_gpt2(0), tiny_gpt2(1)
    x = inputs_for(a)
    kind = type(wrap(a)).__name__
    with pytest.raises(TypeError, match=f"^model_b is a {kind} around a GPT2LMHeadModel: pass model_b.module, the"):
        align(a, wrap(b))
    with pytest.raises(TypeError, match=f"^model is a {kind} around a GPT2LMHeadModel: pass model.module"):
        evaluate(wrap(a), [(x, x)])
    with pytest.raises(TypeError, match=f"^model_a is a {kind} .* pass model_a.module"):
        evaluate_path(wrap(a), b, [(x, x)], [0.5], progress=False)
    with pytest.raises(TypeError, match=f"^the model is a {kind} .* pass the model.module"):
        to_canonical(wrap(a))


def _untied(model, seed):
    """An untied export of `model`'s architecture whose head is not its embedding."""
    config = copy.deepcopy(model.config)
    config.tie_word_embeddings = False
    untied = GPT2LMHeadModel(config).eval()
    untied.load_state_dict(tiny_gpt2(seed).state_dict())
    with torch.no_grad():
        untied.lm_head.weight.normal_(generator=torch.Generator().manual_seed(seed))
    return untied


def test_a_tied_model_and_an_untied_one_make_a_path_as_a_run_pairs_them_the_models_left_as_they_are():
    tied, untied = tiny_gpt2(0), _untied(tiny_gpt2(0), 1)
    x = inputs_for(tied)
    head = untied.lm_head.weight.clone()
    ends = [evaluate(m, [(x, x)])[0] for m in (tied, untied)]
    for a, b, lam_a in ((tied, untied, 1.0), (untied, tied, 0.0)):
        curve = evaluate_path(a, b, [(x, x)], [0.0, 0.5, 1.0], progress=False)
        assert curve["loss"][0] == pytest.approx(ends[lam_a == 1.0], rel=1e-5)
        assert curve["loss"][2] == pytest.approx(ends[lam_a != 1.0], rel=1e-5)
        assert math.isfinite(curve["loss"][1])
    vanilla = align(tied, untied, "vanilla")  # the original models as the path's ends
    assert evaluate_path(vanilla, None, [(x, x)], [1.0], progress=False)["loss"][0] == pytest.approx(ends[0], rel=1e-5)
    assert tied.lm_head.weight is tied.transformer.wte.weight and tied.config.tie_word_embeddings
    assert torch.equal(untied.lm_head.weight, head)


def test_interpolating_a_tied_model_with_an_untied_one_keeps_head_and_embedding_apart():
    tied, untied = tiny_gpt2(0), _untied(tiny_gpt2(0), 1)
    embedding = (tied.transformer.wte.weight + untied.transformer.wte.weight) / 2
    head = (tied.lm_head.weight + untied.lm_head.weight) / 2
    for models in ([tied, untied], [untied, tied]):
        mid = interpolate(models, [0.5, 0.5])
        assert torch.allclose(mid.transformer.wte.weight, embedding)
        assert torch.allclose(mid.lm_head.weight, head)
