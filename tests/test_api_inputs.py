"""The public API's inputs (glmc.api_inputs): models without weights, batches of the wrong form and tasks
that do not fit the model are refused where they enter, naming the argument; a model's task is read from
it when not given."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from glmc import align, evaluate, evaluate_path, to_canonical
from glmc.api_inputs import model_task

from tiny_hf import inputs_for, tiny_encoder, tiny_gpt2, tiny_llama, tiny_vit


def _tokens(batch=4, time=11, seed=1):
    return torch.randint(0, 97, (batch, time), generator=torch.Generator().manual_seed(seed))


def _images(vit):
    return inputs_for(vit), torch.arange(4) % 10


def test_models_on_the_meta_device_are_refused_naming_the_argument():
    with torch.device("meta"):
        empty = tiny_gpt2(2)
    x = _tokens()
    with pytest.raises(ValueError, match="^model has its weights on the meta device.*load_state_dict"):
        evaluate(empty, [(x, x)])
    with pytest.raises(ValueError, match="^model_b has its weights on the meta device"):
        align(tiny_gpt2(0), empty)
    with pytest.raises(ValueError, match="^model_a has its weights on the meta device"):
        evaluate_path(empty, tiny_gpt2(0), [(x, x)], [0.5], progress=False)


def test_a_three_axis_token_batch_is_refused_with_the_shape_to_pass():
    a, x = tiny_gpt2(0), _tokens()
    message = r"loader's inputs have shape \(4, 11, 1\) \(3 axes\), but a gpt2 model reads integer token ids \[batch"
    with pytest.raises(ValueError, match=message):
        evaluate(a, [(x[..., None], x)], "causal_lm")
    with pytest.raises(ValueError, match=r"^data's inputs have shape \(4, 11, 1\)"):
        align(a, tiny_gpt2(1), "activation", data=[(x[..., None], x)])


def test_targets_that_do_not_fit_the_inputs_are_refused():
    x = _tokens()
    with pytest.raises(ValueError, match=r"targets of shape \(4, 5\) do not fit inputs of shape \(4, 11\).*causal_lm"):
        evaluate(tiny_gpt2(0), [(x, x[:, :5])])
    vit = tiny_vit(0)
    images, labels = _images(vit)
    with pytest.raises(ValueError, match=r"targets of shape \(4, 3\) do not fit .* one label per input, shape \[batch"):
        evaluate(vit, [(images, labels[:, None].repeat(1, 3))])
    with pytest.raises(TypeError, match="targets are torch.float32: pass integer labels"):
        evaluate(vit, [(images, labels.float())])


def test_a_language_model_loader_without_task_is_read_as_causal_lm():
    a, x = tiny_gpt2(0), _tokens()
    loss, accuracy = evaluate(a, [(x, x)])  # the default once was classification: a shape error in the loss
    assert loss > 0 and 0 <= accuracy <= 1
    with pytest.raises(ValueError, match="task='classification' does not fit model, a GPT2LMHeadModel built for"):
        evaluate(a, [(x, x)], "classification")
    with pytest.raises(ValueError, match="task='causal-lm' is not one of"):
        evaluate(a, [(x, x)], "causal-lm")
    # a model of no known family falls back to classification, and per-token targets say what to pass
    plain = torch.nn.Sequential(torch.nn.Embedding(97, 8), torch.nn.Linear(8, 97))
    with pytest.raises(ValueError, match="per-token, for task='causal_lm'"):
        evaluate(plain, [(x, x)])


def test_float_images_given_to_gpt2_are_not_called_token_ids():
    vit = tiny_vit(0)
    images, labels = _images(vit)
    with pytest.raises(TypeError, match=r"inputs are torch.float32 of shape \(4, 1, 8, 8\), but a gpt2 model reads "):
        evaluate(tiny_gpt2(0), [(images, labels)])
    with pytest.raises(TypeError, match="inputs are torch.int64 of shape .* a vit model reads float images"):
        evaluate(vit, [(_tokens(), labels)])


def test_batches_and_loaders_of_the_wrong_kind_name_what_to_pass():
    a, x = tiny_gpt2(0), _tokens()
    with pytest.raises(TypeError, match=r"loader yields dicts \(keys \['input_ids', 'labels'\]\)"):
        evaluate(a, [{"input_ids": x, "labels": x}])
    with pytest.raises(TypeError, match=r"a single batch goes in a list: \[\(inputs, targets\)\]"):
        evaluate(a, (x, x))  # one batch where a loader goes
    with pytest.raises(TypeError, match="^loader is a Tensor"):
        evaluate(a, x)
    with pytest.raises(TypeError, match="^model_b is None"):
        evaluate_path(a, None, [(x, x)], [0.5], progress=False)


@pytest.mark.parametrize(
    "build, task",
    [
        (tiny_gpt2, "causal_lm"),
        (tiny_llama, "causal_lm"),
        (tiny_vit, "classification"),
        (lambda: tiny_encoder("bert", "mlm"), "masked_lm"),
        (lambda: tiny_encoder("roberta", "classification"), "classification"),
        (lambda: to_canonical(tiny_gpt2()), "causal_lm"),
        (lambda: torch.nn.Linear(2, 2), None),
    ],
)
def test_the_task_is_read_from_the_model(build, task):
    assert model_task(build()) == task


def test_the_inferred_task_gives_the_same_numbers_as_the_explicit_one():
    a, b, x = tiny_gpt2(0), tiny_gpt2(1), _tokens()
    assert evaluate(a, [(x, x)]) == evaluate(a, [(x, x)], "causal_lm")
    lambdas = [0.0, 0.5, 1.0]
    inferred = evaluate_path(a, b, [(x, x)], lambdas, progress=False)
    assert inferred == evaluate_path(a, b, [(x, x)], lambdas, "causal_lm", progress=False)
    bert = tiny_encoder("bert", "mlm")
    tokens = torch.randint(0, 53, (4, 12), generator=torch.Generator().manual_seed(0))
    targets = torch.where(torch.arange(12) % 3 == 0, tokens, -100)
    assert evaluate(bert, [(tokens, targets)]) == evaluate(bert, [(tokens, targets)], "masked_lm")
    vit = tiny_vit(0)
    data = DataLoader(TensorDataset(*_images(vit)), batch_size=2)
    assert evaluate(vit, data) == evaluate(vit, data, "classification")
