"""The topic-classification task on the embedded corpus: every topic labelled once, datasets with
disjoint topics and every label, deterministic disjoint splits, and the masked-LM corpus's ids."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from glmc.config import DataConfig
from glmc.data.pydoc_corpus import pydoc_splits
from glmc.data.pydoc_topics import (
    LABELS,
    TABLE,
    TOPIC_LABEL,
    check_topic_config,
    max_subsets,
    pydoc_topics_splits,
    topic_datasets,
    topic_texts,
    topic_windows,
)

# conf/data/pydoc_topics.yaml's keys with short windows
TOPICS = DataConfig(
    name="pydoc_topics",
    task="classification",
    tokenizer="wordpiece",
    seq_len=32,
    tokenizer_vocab=1000,
    val_fraction=0.05,
    test_fraction=0.05,
)


@pytest.fixture(scope="module")
def datasets():
    """(train, validation, test, tokenizer) of each of the three datasets."""
    return [pydoc_topics_splits(replace(TOPICS, subset=k)) for k in range(TOPICS.num_subsets)]


def test_every_topic_has_exactly_one_label():
    from pydoc_data.topics import topics

    names = [t for label in LABELS for t in TABLE[label].split()]
    assert len(names) == len(set(names)) == len(TOPIC_LABEL)
    assert set(names) == set(topics)


def test_shared_paragraphs_are_kept_once():
    texts = topic_texts()
    seen: dict[str, str] = {}
    for topic, text in texts.items():
        for paragraph in text.split("\n\n"):
            assert seen.setdefault(paragraph, topic) == topic, f"{topic} and {seen[paragraph]} share a paragraph"
    from pydoc_data.topics import topics

    # the collections keep only what their parts do not hold; "if" is the text of "else"
    for collection in ("compound", "specialnames", "execmodel"):
        assert 0 < len(texts[collection]) < 0.6 * len(topics[collection])
    assert "else" in texts and "if" not in texts


@pytest.mark.parametrize("num_subsets", [2, 3, max_subsets()])
def test_datasets_have_disjoint_topics_and_every_label(num_subsets):
    parts = topic_datasets(num_subsets)
    assert len(parts) == num_subsets
    every = [t for part in parts for t in part]
    assert len(every) == len(set(every)) and set(every) == set(topic_texts())
    for part in parts:
        assert {TOPIC_LABEL[t] for t in part} == set(range(len(LABELS)))
    assert topic_datasets(num_subsets) == parts  # deterministic
    with pytest.raises(ValueError, match=f"data.num_subsets={max_subsets() + 1}"):
        topic_datasets(max_subsets() + 1)


def test_items_are_windows_with_a_label(datasets):
    for train, val, test, tokenizer in datasets:
        for split in (train, val, test):
            inputs, label = split[0]
            assert inputs.shape == (TOPICS.seq_len,) and inputs.dtype == torch.long
            assert label.shape == () and label.dtype == torch.long
            assert (split.inputs[:, 0] == tokenizer.cls_id).all()
            assert split.labels.min() >= 0 and split.labels.max() < len(LABELS)
            assert all(TOPIC_LABEL[t] == int(y) for t, y in zip(split.topics, split.labels))
        # every label is in every dataset's training split, and its test split
        assert set(train.labels.tolist()) == set(test.labels.tolist()) == set(range(len(LABELS)))


def test_splits_are_disjoint_and_follow_the_split_seed(datasets):
    for train, val, test, _ in datasets:
        positions = [set(s.positions) for s in (train, val, test)]
        assert not (positions[0] & positions[1] or positions[0] & positions[2] or positions[1] & positions[2])
        n = sum(map(len, positions))
        assert set().union(*positions) == set(range(n))
        assert positions[2] == set(range(0, n, 10)) and positions[1] == set(range(1, n, 10))
    n = sum(len(s) for s in datasets[0][:3])
    moved = pydoc_topics_splits(replace(TOPICS, split_seed=3))  # dataset 0, shifted by 3
    assert set(moved[2].positions) == {i for i in range(n) if (i + 3) % 10 == 0}
    assert set(moved[1].positions) == {i for i in range(n) if (i + 3) % 10 == 1}
    train = datasets[0][0]
    assert torch.equal(moved[2].inputs[0], train.inputs[train.positions.index(7)])  # window 7 now tests
    # the datasets share no topic
    topics = [set().union(*(s.topics for s in d[:3])) for d in datasets]
    assert not (topics[0] & topics[1] or topics[0] & topics[2] or topics[1] & topics[2])


def test_the_ids_are_those_of_the_masked_lm_corpus(datasets):
    mlm = replace(TOPICS, name="pydoc", task="masked_lm")
    assert pydoc_splits(mlm)[3].vocabulary() == datasets[0][3].vocabulary()


def test_a_short_topic_gives_one_padded_window(datasets):
    tokenizer = datasets[0][3]
    assert topic_windows([7, 8, 9], 6, tokenizer) == [[tokenizer.cls_id, 7, 8, 9, tokenizer.pad_id, tokenizer.pad_id]]
    assert topic_windows(list(range(10, 20)), 6, tokenizer) == [[2, 10, 11, 12, 13, 14], [2, 15, 16, 17, 18, 19]]
    assert topic_windows(list(range(10, 21)), 6, tokenizer)[-1] == [2, 15, 16, 17, 18, 19]  # tail dropped


def test_settings_that_cannot_work_are_named():
    with pytest.raises(ValueError, match="data.subset=3: pick one of the data.num_subsets=3"):
        check_topic_config(replace(TOPICS, subset=3))
    with pytest.raises(ValueError, match="data.tokenizer=char"):
        check_topic_config(replace(TOPICS, tokenizer="char"))
    with pytest.raises(ValueError, match="data.task=causal_lm"):
        check_topic_config(replace(TOPICS, task="causal_lm"))
