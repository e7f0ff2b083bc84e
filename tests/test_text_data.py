"""Text loaders read small files that fixtures write in the real on-disk formats; nothing is downloaded.

The GPT-2 tokenizer is stood in for by a tiny byte-level BPE trained here and saved in Hugging Face
format, so `data.tokenizer=gpt2` runs through the same `AutoTokenizer.from_pretrained` path.
"""

from __future__ import annotations

import itertools
import json

import pytest
import torch

import glmc.data.bookcorpus as bookcorpus
from glmc.data.module import DataModule
from glmc.data.pydoc_corpus import pydoc_text
from glmc.data.text import split_text
from glmc.metrics import IGNORE_INDEX, loss_and_correct

from conftest import compose_config

EOS = "<|endoftext|>"
SUBJECTS = ["The old sailor", "A small child", "My neighbour", "The tired doctor", "Her brother"]
VERBS = ["painted", "found", "carried", "sold"]
OBJECTS = ["a red boat", "the wooden chair", "three letters"]
# 60 distinct sentences in a fixed order, so a row's position says which split it belongs to
SENTENCES = [f"{s} {v} {o}." for s, v, o in itertools.product(SUBJECTS, VERBS, OBJECTS)]


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    """A few-hundred-id byte-level BPE with GPT-2's EOS token, saved with save_pretrained."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2TokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(SENTENCES, vocab_size=400, min_frequency=1, special_tokens=[EOS])
    tok = GPT2TokenizerFast(tokenizer_object=bpe._tokenizer, eos_token=EOS, bos_token=EOS, unk_token=EOS)
    path = tmp_path_factory.mktemp("tokenizer")
    tok.save_pretrained(str(path))
    return path


def saved_vocab_size(tokenizer_dir) -> int:
    """Ids in the saved tokenizer.json (EOS is one of them), read without transformers."""
    return len(json.loads((tokenizer_dir / "tokenizer.json").read_text())["model"]["vocab"])


def setup(*overrides: str, seed: int = 0) -> DataModule:
    dm = DataModule(compose_config(*overrides).data, seed=seed)
    dm.setup()
    return dm


def stacked(dataset, column: int = 0) -> torch.Tensor:
    return torch.stack([dataset[i][column] for i in range(len(dataset))])


# ---------------------------------------------------------------- pydoc (embedded corpus)

SEQ = 16


@pytest.fixture(scope="module")
def pydoc_dm():
    return setup("data=pydoc", f"data.seq_len={SEQ}")


def test_pydoc_splits_are_contiguous_and_disjoint(pydoc_dm):
    text = pydoc_text()
    blocks = split_text(text, 0.05, 0.05)
    assert "".join(blocks) == text
    assert [round(len(b) / len(text), 2) for b in blocks] == [0.9, 0.05, 0.05]
    tok = pydoc_dm.tokenizer
    for dataset, block in zip((pydoc_dm.train_set, pydoc_dm.val_set, pydoc_dm.test_set), blocks):
        assert len(dataset) == len(block) // SEQ  # char ids: one token per character
        decoded = tok.decode(stacked(dataset).flatten().tolist())
        assert decoded == block[: len(dataset) * SEQ]  # each split is its own block, from its start


def test_pydoc_test_windows_fixed_across_instances_and_seeds(pydoc_dm):
    other = setup("data=pydoc", f"data.seq_len={SEQ}", seed=1)
    assert torch.equal(stacked(pydoc_dm.test_set), stacked(other.test_set))
    assert torch.equal(stacked(pydoc_dm.val_set), stacked(other.val_set))
    # the seed does reach the training order, so the equality above is not vacuous
    first = next(iter(pydoc_dm.train_dataloader()))[0]
    assert not torch.equal(first, next(iter(other.train_dataloader()))[0])


def test_pydoc_windows_have_seq_len_tokens(pydoc_dm):
    for dataset in (pydoc_dm.train_set, pydoc_dm.val_set, pydoc_dm.test_set):
        inputs, targets = stacked(dataset), stacked(dataset, 1)
        assert inputs.shape == (len(dataset), SEQ) and inputs.dtype == torch.long
        assert torch.equal(inputs, targets)  # the loss shifts them, the dataset does not


def test_char_tokenizer_roundtrips_and_counts_distinct_characters(pydoc_dm):
    tok, text = pydoc_dm.tokenizer, pydoc_text()
    assert tok.vocab_size == pydoc_dm.vocab_size == len(set(text))
    sample = text[1000:3000]
    assert tok.decode(tok.encode(sample)) == sample
    assert max(tok.encode(text)) == tok.vocab_size - 1


def test_pydoc_with_saved_gpt2_tokenizer(tokenizer_dir):
    dm = setup("data=pydoc", "data.tokenizer=gpt2", f"data.tokenizer_path={tokenizer_dir}", f"data.seq_len={SEQ}")
    tok = dm.tokenizer
    assert dm.vocab_size == saved_vocab_size(tokenizer_dir) and tok.eos_id == tok.hf.convert_tokens_to_ids(EOS)
    test_block = split_text(pydoc_text(), 0.05, 0.05)[2]
    ids = tok.encode(test_block)
    assert len(dm.test_set) == len(ids) // SEQ
    assert stacked(dm.test_set).flatten().tolist() == ids[: len(dm.test_set) * SEQ]


# ---------------------------------------------------------------- tiny_shakespeare

SHAKESPEARE = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
    "First Citizen:\nYou are all resolved rather to die than to famish?\n\nAll:\nResolved. resolved.\n\n"
) * 20


@pytest.fixture
def shakespeare_root(tmp_path):
    folder = tmp_path / "tiny_shakespeare"
    folder.mkdir()
    (folder / "input.txt").write_text(SHAKESPEARE, encoding="utf-8")
    return tmp_path


def test_tiny_shakespeare_from_disk(shakespeare_root):
    assert 3000 < len(SHAKESPEARE) < 10000
    dm = setup("data=tiny_shakespeare", f"data.root={shakespeare_root}", "data.seq_len=8")
    blocks = split_text(SHAKESPEARE, 0.05, 0.05)
    assert dm.vocab_size == len(set(SHAKESPEARE))
    for dataset, block in zip((dm.train_set, dm.val_set, dm.test_set), blocks):
        assert len(dataset) == len(block) // 8
        assert dm.tokenizer.decode(stacked(dataset).flatten().tolist()) == block[: len(dataset) * 8]


def test_tiny_shakespeare_missing_file_names_path_and_download(tmp_path):
    cfg = compose_config("data=tiny_shakespeare", f"data.root={tmp_path}")
    with pytest.raises(FileNotFoundError) as err:
        DataModule(cfg.data).setup()
    assert str(tmp_path / "tiny_shakespeare" / "input.txt") in str(err.value)
    assert "data.download=true" in str(err.value)


# ---------------------------------------------------------------- bookcorpus

# one sentence long enough to be cut at seq_len, so truncation is exercised too
BOOK = SENTENCES[:-1] + [" ".join(SENTENCES[:8])]


@pytest.fixture
def book_root(tmp_path):
    from datasets import Dataset

    Dataset.from_dict({"text": BOOK}).save_to_disk(str(tmp_path / "bookcorpus"))
    return tmp_path


def book(root, tokenizer_dir, *overrides: str) -> DataModule:
    return setup(
        "data=bookcorpus",
        f"data.root={root}",
        f"data.tokenizer_path={tokenizer_dir}",
        "data.seq_len=16",
        "data.val_fraction=0.1",
        "data.test_fraction=0.1",
        *overrides,
    )


def check_padded(dataset, texts, tok, seq_len):
    """Rows are the texts in order: ids then EOS padding; targets stop after the first EOS."""
    assert len(dataset) == len(texts)
    padded = 0
    for (inputs, targets), text in zip((dataset[i] for i in range(len(dataset))), texts):
        ids = tok.encode(text)[:seq_len]
        n = len(ids)
        assert inputs.shape == targets.shape == (seq_len,)
        assert inputs[:n].tolist() == ids and targets[:n].tolist() == ids
        assert (inputs[n:] == tok.eos_id).all()
        if n < seq_len:
            padded += 1
            assert targets[n].item() == tok.eos_id  # the model learns to end the example
            assert (targets[n + 1 :] == IGNORE_INDEX).all()
    return padded


def test_bookcorpus_splits_follow_fractions_and_pad_with_eos(book_root, tokenizer_dir):
    dm = book(book_root, tokenizer_dir)
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (48, 6, 6)
    tok = dm.tokenizer
    assert dm.vocab_size == saved_vocab_size(tokenizer_dir)
    padded = sum(
        check_padded(dataset, texts, tok, 16)
        for dataset, texts in ((dm.train_set, BOOK[:48]), (dm.val_set, BOOK[48:54]), (dm.test_set, BOOK[54:]))
    )
    assert 0 < padded < len(BOOK)  # both padded rows and the long, cut row were checked
    inputs, targets = dm.test_set[5]  # the long sentence: cut, no EOS, every target counted
    assert (targets != IGNORE_INDEX).all() and tok.eos_id not in inputs.tolist()


def test_bookcorpus_limits_apply_before_tokenizing(book_root, tokenizer_dir, monkeypatch):
    seen = []
    encode = bookcorpus.encode_rows

    def recording(tok, texts, seq_len):
        seen.append(list(texts))
        return encode(tok, texts, seq_len)

    monkeypatch.setattr(bookcorpus, "encode_rows", recording)
    dm = book(book_root, tokenizer_dir, "data.limit_train=5", "data.limit_test=2")
    assert seen == [BOOK[:5], BOOK[48:50], BOOK[54:56]]
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (5, 2, 2)
    check_padded(dm.test_set, BOOK[54:56], dm.tokenizer, 16)


def test_padded_rows_are_stored_unpadded_and_packed_rows_match_lists():
    from glmc.data.text import PaddedSequences

    rows = [[5, 6, 7], [], [8, 9, 10, 11, 12, 13], [4]]
    plain = PaddedSequences(rows, 4, eos_id=0)
    lengths = torch.tensor([3, 0, 4, 1])
    packed = PaddedSequences.packed(torch.tensor([5, 6, 7, 8, 9, 10, 11, 4]), lengths, 4, eos_id=0)
    assert plain.flat.dtype == torch.int32 and plain.flat.numel() == 8  # cut, never padded in memory
    for i in range(len(rows)):
        assert all(torch.equal(a, b) for a, b in zip(plain[i], packed[i]))
    inputs, targets = plain[1]  # an empty row: EOS, then padding no loss counts
    assert inputs.tolist() == [0, 0, 0, 0] and targets.tolist() == [0, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX]
    with pytest.raises(ValueError, match="at most 4"):
        PaddedSequences.packed(torch.zeros(5, dtype=torch.int32), torch.tensor([5]), 4, eos_id=0)


def test_bookcorpus_dataset_dict_with_train_split(tmp_path, tokenizer_dir):
    from datasets import Dataset, DatasetDict

    reversed_book = BOOK[::-1]
    DatasetDict({"train": Dataset.from_dict({"text": reversed_book})}).save_to_disk(str(tmp_path / "bookcorpus"))
    dm = book(tmp_path, tokenizer_dir, "data.seq_len=32")
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (48, 6, 6)
    check_padded(dm.test_set, reversed_book[54:], dm.tokenizer, 32)


def test_bookcorpus_missing_folder_offline(tmp_path, tokenizer_dir):
    with pytest.raises(FileNotFoundError) as err:
        book(tmp_path, tokenizer_dir)
    message = str(err.value)
    assert str(tmp_path / "bookcorpus") in message
    assert "data.download=true" in message and "data.root" in message


def test_bookcorpus_rejects_char_tokenizer(book_root, tokenizer_dir):
    with pytest.raises(ValueError, match="data.tokenizer"):
        book(book_root, tokenizer_dir, "data.tokenizer=char")


# ---------------------------------------------------------------- gpt2 tokenizer settings


def test_gpt2_without_path_offline_names_tokenizer_path():
    cfg = compose_config("data=pydoc", "data.tokenizer=gpt2")
    assert cfg.data.tokenizer_path is None and not cfg.data.download
    with pytest.raises(FileNotFoundError, match="data.tokenizer_path"):
        DataModule(cfg.data).setup()


def test_gpt2_missing_tokenizer_path_is_named(tmp_path):
    missing = tmp_path / "no_tokenizer_here"
    cfg = compose_config("data=pydoc", "data.tokenizer=gpt2", f"data.tokenizer_path={missing}")
    with pytest.raises(FileNotFoundError) as err:
        DataModule(cfg.data).setup()
    assert str(missing) in str(err.value)


# ---------------------------------------------------------------- causal-LM loss with padding


@pytest.mark.numeric
def test_causal_lm_loss_counts_only_non_ignored_targets():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 4, 5, generator=g)
    targets = torch.tensor([[1, 2, 3, IGNORE_INDEX], [4, 0, IGNORE_INDEX, IGNORE_INDEX]])
    loss, correct, count = loss_and_correct(logits, targets, "causal_lm")
    # position t predicts target t+1: counted pairs are (0,0->2), (0,1->3), (1,0->0)
    log_p = torch.log_softmax(logits, -1)
    pairs = [(0, 0, 2), (0, 1, 3), (1, 0, 0)]
    expected = -sum(log_p[b, t, y] for b, t, y in pairs)
    assert int(count) == 3
    assert torch.allclose(loss, expected)
    assert int(correct) == sum(int(logits[b, t].argmax() == y) for b, t, y in pairs)
