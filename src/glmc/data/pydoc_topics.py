"""Topic classification on the embedded corpus (`data=pydoc_topics`): which part of the language a
window of a Python help topic comes from.

Labels. Each of the 79 help topics of `pydoc_data.topics` gets one of four labels (`TABLE` below):

    0 statement     the simple and compound statements (language reference, chapters 7 and 8)
    1 expression    expressions, operators, and the lexical syntax of names and literals (chapters 2, 6)
    2 builtin       the built-in types and their methods, and the library's pdb (library reference)
    3 data_model    the data and execution models: objects, special methods, names, exceptions (3, 4)

Text. Many topics repeat others: "compound" holds every compound statement, "specialnames" the
customisation topics, "execmodel" "naming" and "exceptions", and "if" and "else" are one text. A
paragraph (text between blank lines) that occurs in several topics is kept only in the shortest of them
(ties: the first name), so no text is in two datasets; a topic left with no text ("if", whose text
"else" keeps) is left out. A topic's own paragraphs, joined, are tokenized with the WordPiece tokenizer
of the masked-LM pretraining corpus (below) and cut into windows of [CLS] + (`data.seq_len` - 1)
tokens, non-overlapping, the shorter tail dropped. A topic too short for one window gives one window
padded with [PAD] after its text; the models get no attention mask, so they see those [PAD]s (none at
seq_len 64; 6 of the 971 windows at seq_len 128). An item is (input_ids (seq_len,), label), both
LongTensors, the label a scalar.

Datasets. `data.num_subsets` (default 3) datasets share the labels but not the topics, a domain shift
like that between paper 002's emotion datasets: within each label the topics, largest first (characters
of their own text; ties by name), go each to the dataset holding the fewest characters of that label so
far (ties: the lower index), so every dataset gets every label in about equal amounts. `data.subset`
picks one. Models fine-tuned on one dataset from two seeds give in-domain pairs; on different datasets,
cross-dataset pairs.

Splits. A dataset's windows, in the order of their topics' names and of their place in the text, are
numbered i = 0, 1, ...; window i is a test window when (i + data.split_seed) % 10 == 0, a validation
window when it is 1, a training window otherwise: 10 / 10 / 80 %, every topic spread over the splits.
Neighbouring windows of one topic can fall in different splits, and a line repeated inside a paragraph
(the rules of operator-summary's table) can give equal windows in two splits.

Tokenizer. The WordPiece tokenizer is the one `data=pydoc_mlm` trains: on the training block of the
whole corpus (`pydoc_text()` split by `data.val_fraction` and `data.test_fraction`, as glmc.data.text
does) with `data.tokenizer_vocab` ids, so a model pretrained there and fine-tuned here reads the same
ids; keep those three keys equal to the pretraining run's, or point `data.tokenizer_path` at the
tokenizer saved with the pretrained model. The pretraining block holds the text (not the labels) of
most test windows here: the task measures what a model learns about topics, not unseen text.

Measured with conf/data/pydoc_topics.yaml (seq_len 64, tokenizer_vocab 1000, val/test fractions 0.05,
split_seed 0; Python 3.11's topics, 78 of them with text of their own), windows per label (statement /
expression / builtin / data_model), of which the largest label is a third:

    dataset 0 (25 topics)  695 windows   137 / 127 / 234 / 197   train 555, validation 70, test 70
    dataset 1 (28 topics)  639 windows   124 / 105 / 213 / 197   train 511, validation 64, test 64
    dataset 2 (25 topics)  655 windows   128 / 116 / 211 / 200   train 523, validation 66, test 66
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
