"""Two lm-evaluation-harness tasks built from the embedded corpus, written as lm-eval YAML with local JSON
lines beside it (`dataset_path: json`), so that task barriers need no network:

- `pydoc_next_chars`: which of four 8-character spans comes next after 64 characters of the held-out
  block of data=pydoc (its last 5 %, which no endpoint trained on); the other three are spans from
  elsewhere in that block. Scored by loglikelihood (lm-eval's multiple choice; metric acc).
- `pydoc_topic_choice`: a paragraph of a help topic (data=pydoc_topics's own texts), then "Topic:", and
  which of the four labels follows (statement, expression, builtin, data model). A language model trained
  on the corpus has never seen the prompt: a zero-shot probe of what it knows about the text.

Both are drawn with a fixed seed, so the same Python (its pydoc_data) gives the same examples."""

from __future__ import annotations

import json
import random
from pathlib import Path

from glmc.data.pydoc_corpus import pydoc_text
from glmc.data.pydoc_topics import LABELS, TOPIC_LABEL, topic_texts
from glmc.data.text import split_text
from glmc.safe_files import atomic_write_text

SHIPPED = ("pydoc_next_chars", "pydoc_topic_choice")
CONTEXT_CHARS, SPAN_CHARS, CHOICES = 64, 8, 4
NEXT_EXAMPLES, TOPIC_EXAMPLES_PER_LABEL = 250, 60
TOPIC_WORDS = {"statement": " statement", "expression": " expression", "builtin": " builtin"}
TOPIC_WORDS["data_model"] = " data model"
TASKS_VERSION = 1  # bumped when the examples change

# lm-eval's multiple choice over a JSON-lines file; `target_delimiter: ""`: the choices carry their own
# leading characters (a character-level model scores exactly the characters that follow)
TEMPLATE = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
target_delimiter: ""
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: {version}
"""


def next_chars_examples(seed: int = 0) -> list[dict]:
    """`pydoc_next_chars`: context, four spans (one the true continuation), the true one's index."""
    held_out = split_text(pydoc_text(), 0.05, 0.05)[2]
    rng = random.Random(seed)
    starts = range(CONTEXT_CHARS, len(held_out) - SPAN_CHARS)
    step = max(1, len(starts) // NEXT_EXAMPLES)
    examples = []
    for s in starts[::step][:NEXT_EXAMPLES]:
        true = held_out[s : s + SPAN_CHARS]
        others: list[str] = []
        while len(others) < CHOICES - 1:
            o = rng.randrange(len(held_out) - SPAN_CHARS)
            span = held_out[o : o + SPAN_CHARS]
            if span != true and span not in others:
                others.append(span)
        label = rng.randrange(CHOICES)
        choices = others[:label] + [true] + others[label:]
        examples.append({"context": held_out[s - CONTEXT_CHARS : s], "choices": choices, "label": label})
    return examples


def topic_examples(seed: int = 0) -> list[dict]:
    """`pydoc_topic_choice`: up to TOPIC_EXAMPLES_PER_LABEL paragraphs of each label's topics, each cut to
    CONTEXT_CHARS * 2 characters and followed by "\\nTopic:"."""
    rng = random.Random(seed)
    by_label: dict[str, list[str]] = {label: [] for label in LABELS}
    for topic, text in sorted(topic_texts().items()):
        paragraphs = [p.strip() for p in text.split("\n\n") if len(p.strip()) >= CONTEXT_CHARS]
        by_label[LABELS[TOPIC_LABEL[topic]]] += [p[: 2 * CONTEXT_CHARS] for p in paragraphs]
    examples = []
    for label, paragraphs in by_label.items():
        rng.shuffle(paragraphs)
        for p in paragraphs[:TOPIC_EXAMPLES_PER_LABEL]:
            choices = [TOPIC_WORDS[name] for name in LABELS]
            examples.append({"context": f"{p}\nTopic:", "choices": choices, "label": LABELS.index(label)})
    rng.shuffle(examples)
    return examples


def write_shipped_tasks(folder: Path) -> Path:
    """Both tasks' YAML and data files in `folder` (rewritten only where their text changed); returns it."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, examples in (("pydoc_next_chars", next_chars_examples()), ("pydoc_topic_choice", topic_examples())):
        data = folder / f"{name}.jsonl"
        _write_if_changed(data, "".join(json.dumps(e) + "\n" for e in examples))
        yaml_text = TEMPLATE.format(name=name, data=json.dumps(str(data.resolve())), version=TASKS_VERSION)
        _write_if_changed(folder / f"{name}.yaml", yaml_text)
    return folder


def _write_if_changed(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        atomic_write_text(path, text)
