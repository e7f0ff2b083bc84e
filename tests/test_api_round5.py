"""The public API refuses, where they enter: a model without its head, an empty loader (naming the argument,
not a command-line key), images of other channels or size than the model reads, and a model on the meta
device given to to_canonical."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset
from transformers import GPT2ForSequenceClassification
from transformers.modeling_outputs import BaseModelOutput

from glmc import align, evaluate, evaluate_path, to_canonical

from tiny_hf import inputs_for, tiny_gpt2, tiny_vit


def _tokens(batch=4, time=11):
    return torch.randint(0, 97, (batch, time), generator=torch.Generator().manual_seed(0))


def test_a_model_without_its_head_is_refused_by_evaluate_align_and_to_canonical():
    gpt2, x = tiny_gpt2(0), _tokens()
    body = r"GPT2Model, the bare gpt2 body without its head .*pass the model with its head, GPT2LMHeadModel"
    with pytest.raises(TypeError, match="^model is a " + body):
        evaluate(gpt2.transformer, [(x, x)])
    with pytest.raises(TypeError, match="^model_a is a " + body):
        evaluate_path(gpt2.transformer, gpt2, [(x, x)], [0.5], progress=False)
    with pytest.raises(TypeError, match="^model_b is a " + body):
        align(gpt2, tiny_gpt2(1).transformer)
    with pytest.raises(TypeError, match="^the model is a " + body):
        to_canonical(gpt2.transformer)
    vit = tiny_vit(0)
    with pytest.raises(TypeError, match="^model is a ViTModel, the bare vit body .* ViTForImageClassification"):
        evaluate(vit.vit, [(inputs_for(vit), torch.arange(4))])
    # a head the family does not convert is named as such, not called headless
    classifier = GPT2ForSequenceClassification(gpt2.config)
    with pytest.raises(TypeError, match="^model is a GPT2ForSequenceClassification, a head the gpt2 family does not"):
        evaluate(classifier, [(x, x[:, 0])])


def test_a_body_of_no_known_family_is_refused_by_the_evaluator_for_its_missing_logits():
    class Body(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(3, 5)

        def forward(self, inputs):
            return BaseModelOutput(last_hidden_state=self.linear(inputs))

    with pytest.raises(TypeError, match="^Body returned a BaseModelOutput without logits: evaluate the model with its"):
        evaluate(Body(), [(torch.randn(4, 3), torch.arange(4))])


def test_an_empty_loader_is_refused_naming_the_argument_not_a_command_line_key():
    gpt2, x = tiny_gpt2(0), _tokens()
    for empty in ([], iter([]), DataLoader(TensorDataset(x[:3], x[:3]), batch_size=4, drop_last=True)):
        with pytest.raises(ValueError, match="^loader yielded no batches: pass a non-empty iterable") as err:
            evaluate(gpt2, empty)
        assert "limit_test" not in str(err.value)
    with pytest.raises(ValueError, match="^loader yielded no batches"):
        evaluate_path(gpt2, tiny_gpt2(1), [], [0.0, 1.0], progress=False)
    ignored = torch.full_like(x, -100)
    ignored[:, 0] = x[:, 0]  # the first position is never predicted: still nothing to score
    with pytest.raises(ValueError, match="^loader's batches hold nothing to score: every target after the first"):
        evaluate(gpt2, [(x, ignored)])
    with pytest.raises(ValueError, match="^data yielded no batches"):
        align(gpt2, tiny_gpt2(1), "activation", data=[])
    with pytest.raises(ValueError, match=r"^data yields no batches \(its dataset has 0 samples\)"):
        align(gpt2, tiny_gpt2(1), "activation", data=DataLoader(TensorDataset(x[:0], x[:0]), batch_size=2))


def test_images_of_other_channels_or_size_are_refused_naming_both_shapes():
    vit, labels = tiny_vit(0), torch.arange(4)
    expected = r"reads images of shape \[batch, 1, 8, 8\] \(1 channel, 8x8 pixels\)"
    for model in (vit, to_canonical(vit)):
        channels = r"^inputs of shape \(4, 3, 8, 8\) do not fit the model, which "
        with pytest.raises(ValueError, match=channels + expected):
            evaluate(model, [(torch.randn(4, 3, 8, 8), labels)])
        with pytest.raises(ValueError, match=r"^inputs of shape \(4, 1, 16, 16\) do not fit .*" + expected):
            evaluate(model, [(torch.randn(4, 1, 16, 16), labels)])
    rgb = tiny_vit(0, channels=3, image=12, patch=3)
    with pytest.raises(ValueError, match=r"\(4, 1, 12, 12\) .* shape \[batch, 3, 12, 12\] \(3 channels, 12x12"):
        align(rgb, tiny_vit(1, channels=3, image=12, patch=3), "activation", data=[(torch.randn(4, 1, 12, 12), labels)])
    loss, accuracy = evaluate(rgb, [(torch.randn(4, 3, 12, 12), labels)])  # the model's own shape still runs
    assert loss > 0 and 0 <= accuracy <= 1
    x = _tokens()
    with pytest.raises(ValueError, match="^input token id 97 is outside the model's vocabulary of 97 ids"):
        evaluate(tiny_gpt2(0), [(torch.cat([x, torch.full((4, 1), 97)], 1), x.new_zeros(4, 12))])


def test_to_canonical_refuses_a_model_on_the_meta_device_as_align_and_evaluate_do():
    with torch.device("meta"):
        empty = tiny_gpt2(2)
    with pytest.raises(ValueError, match=r"^the model has its weights on the meta device \(transformer.wte.weight"):
        to_canonical(empty)
    with pytest.raises(ValueError, match="^model_b has its weights on the meta device"):
        to_canonical(empty, "model_b")
    loaded = to_canonical(tiny_gpt2(0))
    assert not any(t.is_meta for t in loaded.params().values()) and torch.isfinite(loaded(_tokens())).all()
