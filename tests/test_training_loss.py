"""The loss an endpoint trains on, shared by EndpointModule and benchmarks/learned_step_cost.py."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from glmc.metrics import IGNORE_INDEX
from glmc.train.endpoint import training_loss


@pytest.mark.parametrize("time, vocab", [(7, 5), (6, 6), (3, 9)])  # the sequence as long as the vocabulary too
def test_a_causal_lm_trains_on_the_next_tokens_cross_entropy(time, vocab):
    g = torch.Generator().manual_seed(time)
    logits = torch.randn(2, time, vocab, generator=g)
    tokens = torch.randint(0, vocab, (2, time), generator=g)
    by_hand = [-torch.log_softmax(logits[b, t], -1)[tokens[b, t + 1]] for b in range(2) for t in range(time - 1)]
    expected = float(sum(by_hand) / len(by_hand))
    assert math.isclose(float(training_loss(logits, tokens, "causal_lm")), expected, rel_tol=1e-5)


def test_masked_positions_and_classification():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 4, 10, generator=g)
    targets = torch.full((2, 4), IGNORE_INDEX)
    targets[0, 1], targets[1, 3] = 3, 7  # the masked positions: the only ones counted
    expected = (F.cross_entropy(logits[0, 1], torch.tensor(3)) + F.cross_entropy(logits[1, 3], torch.tensor(7))) / 2
    assert math.isclose(float(training_loss(logits, targets, "masked_lm")), float(expected), rel_tol=1e-5)
    images = torch.randn(3, 10, generator=g)
    labels = torch.tensor([1, 2, 3])
    smoothed = F.cross_entropy(images, labels, label_smoothing=0.1)
    assert math.isclose(float(training_loss(images, labels, "classification", 0.1)), float(smoothed), rel_tol=1e-6)
