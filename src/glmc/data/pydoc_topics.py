"""Topic classification on the embedded corpus (`data=pydoc_topics`): which of four labels (`TABLE`:
statement, expression, builtin, data_model) the Python help topic of a window has.

A paragraph several topics hold stays only in the shortest (ties: the first name). Each topic's text is
cut into [CLS] + (seq_len - 1) token windows with data=pydoc_mlm's WordPiece tokenizer (a short topic
gives one window padded with [PAD]). `data.num_subsets` datasets share the labels, not the topics: each
topic, largest first, goes to the dataset holding the fewest characters of its label. Window i is a test
window when (i + data.split_seed) % 10 == 0, a validation window when it is 1, else a training one.
"""

from __future__ import annotations

import json
from functools import lru_cache

import torch
from torch import Tensor
from torch.utils.data import Dataset

from glmc.config import DataConfig

LABELS = ("statement", "expression", "builtin", "data_model")
# label -> the help topics (pydoc_data.topics keys) it holds; every topic has exactly one label
TABLE = {
    "statement": """
        assert assignment async augassign break class compound continue del else for function global
        if import nonlocal pass raise return try while with yield
    """,
    "expression": """
        atom-identifiers atom-literals attribute-references await binary bitwise booleans calls
        comparisons conversions dict exprlists floating id-classes identifiers imaginary in integers
        lambda lists numbers operator-summary power shifting slicings strings subscriptions unary
    """,
    "builtin": """
        bltin-code-objects bltin-ellipsis-object bltin-null-object bltin-type-objects debugger
        formatstrings specialattrs string-methods truth typesfunctions typesmapping typesmethods
        typesmodules typesseq typesseq-mutable
    """,
    "data_model": """
        attribute-access callable-types context-managers customization dynamic-features exceptions
        execmodel naming numeric-types objects sequence-types specialnames types
    """,
}
TOPIC_LABEL = {topic: label for label, name in enumerate(LABELS) for topic in TABLE[name].split()}
RULES_VERSION = 1  # bumped when the rules below change the examples (part of the endpoint cache key)
SPLIT_PERIOD = 10  # one window in ten to test, the next to validation


def task_definition() -> str:
    """The labels and the rules' version as text: glmc.data.fingerprint sums it with the corpus."""
    return json.dumps({"labels": LABELS, "table": TOPIC_LABEL, "version": RULES_VERSION}, sort_keys=True)


def _topics() -> dict[str, str]:
    from pydoc_data.topics import topics

    unknown = sorted(set(topics) - set(TOPIC_LABEL))
    if unknown:
        raise ValueError(
            f"this Python's pydoc_data.topics has topics without a label in glmc.data.pydoc_topics.TABLE: "
            f"{', '.join(unknown)}; add each to one label there"
        )
    return {name: topics[name] for name in sorted(topics)}


def _paragraphs(text: str) -> list[str]:
    return [p.strip() for p in text.split("\n\n") if p.strip()]


@lru_cache(maxsize=1)
def topic_texts() -> dict[str, str]:
    """Each topic's own text: its paragraphs that no shorter topic (or, as long, an earlier name)
    also holds. Topics left with nothing are absent."""
    topics = _topics()
    order = sorted(topics, key=lambda name: (len(topics[name]), name))  # who keeps a shared paragraph first
    owner: dict[str, str] = {}
    for name in order:
        for paragraph in _paragraphs(topics[name]):
            owner.setdefault(paragraph, name)
    own = {name: [p for p in _paragraphs(topics[name]) if owner[p] == name] for name in topics}
    return {name: "\n\n".join(dict.fromkeys(ps)) for name, ps in own.items() if ps}


def topic_datasets(num_subsets: int) -> list[list[str]]:
    """The topics of each of `num_subsets` datasets, each list in name order."""
    texts = topic_texts()
    datasets: list[list[str]] = [[] for _ in range(num_subsets)]
    for label in LABELS:
        topics = sorted((t for t in texts if LABELS[TOPIC_LABEL[t]] == label), key=lambda t: (-len(texts[t]), t))
        if len(topics) < num_subsets:
            raise ValueError(
                f"data.num_subsets={num_subsets}: label {label} has only {len(topics)} topics, so some dataset "
                f"would lack it; use data.num_subsets<={len(topics)}"
            )
        held = [0] * num_subsets
        for topic in topics:
            k = min(range(num_subsets), key=lambda j: (held[j], j))
            datasets[k].append(topic)
            held[k] += len(texts[topic])
    return [sorted(d) for d in datasets]


def max_subsets() -> int:
    """The most datasets that can each hold every label."""
    texts = topic_texts()
    return min(sum(LABELS[TOPIC_LABEL[t]] == label for t in texts) for label in LABELS)


def topic_windows(ids: list[int], seq_len: int, tokenizer) -> list[list[int]]:
    """[CLS] + (seq_len - 1) tokens per window; a text shorter than one window gives one padded window."""
    body = seq_len - 1
    windows = [[tokenizer.cls_id, *ids[i : i + body]] for i in range(0, len(ids) - body + 1, body)]
    if not windows:
        windows = [[tokenizer.cls_id, *ids] + [tokenizer.pad_id] * (body - len(ids))]
    return windows


class TopicWindows(Dataset):
    """Windows and their labels; `topics[i]` names the topic window i comes from and `positions[i]`
    its number among the dataset's windows (the i of the split rule)."""

    def __init__(
        self, windows: list[list[int]], labels: list[int], topics: list[str], positions: list[int], seq_len: int
    ):
        self.inputs = torch.tensor(windows, dtype=torch.long).view(len(windows), seq_len)
        self.labels = torch.tensor(labels, dtype=torch.long)
        self.topics, self.positions = topics, positions

    def __len__(self) -> int:
        return self.labels.numel()

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        return self.inputs[i], self.labels[i]


def pretraining_tokenizer(cfg: DataConfig):
    """The tokenizer of the masked-LM corpus (data=pydoc_mlm) with the same data.* keys."""
    from glmc.data.pydoc_corpus import pydoc_text
    from glmc.data.text import make_tokenizer, split_text

    text = pydoc_text()
    return make_tokenizer(cfg, text, training_text=split_text(text, cfg.val_fraction, cfg.test_fraction)[0])


def check_topic_config(cfg: DataConfig) -> None:
    if str(cfg.task) != "classification":
        raise ValueError(f"data.task={cfg.task}: data=pydoc_topics is a classification task (data.task=classification)")
    if str(cfg.tokenizer) not in ("wordpiece", "pretrained"):
        raise ValueError(
            f"data.tokenizer={cfg.tokenizer}: data=pydoc_topics reads the masked-LM corpus's WordPiece ids "
            "(data.tokenizer=wordpiece)"
        )
    if cfg.seq_len < 2:
        raise ValueError(f"data.seq_len={cfg.seq_len}: a window needs [CLS] and at least one token")
    if not 0 <= cfg.subset < cfg.num_subsets:
        raise ValueError(
            f"data.subset={cfg.subset}: pick one of the data.num_subsets={cfg.num_subsets} datasets "
            f"(0 to {cfg.num_subsets - 1})"
        )


def pydoc_topics_splits(cfg: DataConfig):
    """Train / validation / test TopicWindows of dataset `data.subset`, and the tokenizer."""
    check_topic_config(cfg)
    topics = topic_datasets(int(cfg.num_subsets))[int(cfg.subset)]
    tokenizer = pretraining_tokenizer(cfg)
    if hasattr(tokenizer, "require"):  # a saved tokenizer (data.tokenizer=pretrained): windows need both
        tokenizer.require("data=pydoc_topics", cls_id="classification token ([CLS])", pad_id="padding token")
    texts = topic_texts()
    splits: dict[str, tuple[list, ...]] = {s: ([], [], [], []) for s in ("train", "validation", "test")}
    i = 0
    for topic in topics:
        for window in topic_windows(tokenizer.encode(texts[topic]), cfg.seq_len, tokenizer):
            place = (i + cfg.split_seed) % SPLIT_PERIOD
            windows, labels, names, positions = splits[
                "test" if place == 0 else "validation" if place == 1 else "train"
            ]
            windows.append(window)
            labels.append(TOPIC_LABEL[topic])
            names.append(topic)
            positions.append(i)
            i += 1
    train, val, test = (TopicWindows(*splits[s], cfg.seq_len) for s in ("train", "validation", "test"))
    for name, split in (("validation", val), ("test", test)):
        if len(split) == 0:
            raise ValueError(
                f"dataset data.subset={cfg.subset} gives no {name} window at data.seq_len={cfg.seq_len}; "
                "use a smaller data.seq_len"
            )
    return train, val, test, tokenizer
