"""Masked-LM data on the embedded corpus: BERT's masking, fixed evaluation masks, the WordPiece
tokenizer (deterministic, saved and loaded through data.tokenizer_path, damaged folders named), and the
masked-LM loss counting the masked positions only."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from glmc.config import DataConfig
from glmc.data.masked_lm import MaskedWindows, Masking, masked_windows
from glmc.data.pydoc_corpus import pydoc_splits, pydoc_text
from glmc.data.text import split_text
from glmc.data.wordpiece import (
    SPECIAL_TOKENS,
    WordPieceTokenizer,
    build_tokenizer,
    learn_vocabulary,
    load_wordpiece,
    word_counts,
    wordpiece_tokenizer,
)
from glmc.metrics import IGNORE_INDEX, flat_predictions, loss_and_correct

from numeric import FEW_OPS, assert_close_rel

# conf/data/pydoc_mlm.yaml's keys with short windows
MLM = DataConfig(
    name="pydoc",
    task="masked_lm",
    tokenizer="wordpiece",
    seq_len=16,
    tokenizer_vocab=1000,
    val_fraction=0.05,
    test_fraction=0.05,
)


@pytest.fixture(scope="module")
def splits():
    """(train, validation, test, tokenizer) of the masked-LM corpus, built once for the module."""
    return pydoc_splits(MLM)


@pytest.fixture(scope="module")
def tokenizer(splits):
    return splits[3]


def test_the_tokenizer_has_the_special_ids_and_learns_from_the_training_block_only(tokenizer):
    ids = (tokenizer.pad_id, tokenizer.unk_id, tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id)
    assert ids == (0, 1, 2, 3, 4)
    assert tokenizer.special_ids == (0, 1, 2, 3, 4)
    assert tokenizer.vocab_size == 1000 == len(set(tokenizer.vocabulary()))
    assert tokenizer.vocabulary()[:5] == list(SPECIAL_TOKENS)
    train = split_text(pydoc_text(), MLM.val_fraction, MLM.test_fraction)[0]
    assert wordpiece_tokenizer(MLM, train) is tokenizer  # trained on the training block (and kept)
    text = "The assert statement is a convenient way to insert debugging assertions."
    ids = tokenizer.encode(text)
    assert tokenizer.cls_id not in ids and tokenizer.unk_id not in ids
    assert tokenizer.decode(ids) == text


def test_the_vocabulary_is_learned_deterministically():
    """Most frequent pair first, ties by the pieces' text: the same pieces in the same order."""
    text = "low low low lower lower newest newest widest widest widest"
    vocab = learn_vocabulary(word_counts(text), 5 + 2 * 10 + 4)
    alphabet = sorted(set(text) - {" "})
    assert vocab[:5] == list(SPECIAL_TOKENS)
    assert vocab[5:25] == alphabet + ["##" + c for c in alphabet]
    # (##e, ##s), (##o, ##w), (##s, ##t) and (l, ##o) all occur 5 times: the first by text wins, then
    # (##es, ##t) 5 times comes before (##o, ##w), and (l, ##ow) follows
    assert vocab[25:] == ["##es", "##est", "##ow", "low"]
    corpus = split_text(pydoc_text()[:60_000], 0.05, 0.05)[0]
    assert learn_vocabulary(word_counts(corpus), 400) == learn_vocabulary(word_counts(corpus), 400)


def test_the_vocabulary_size_names_the_key():
    with pytest.raises(ValueError, match=r"data.tokenizer_vocab=10 is smaller than the \d+ ids"):
        learn_vocabulary(word_counts("some text"), 10)


def test_a_saved_tokenizer_loads_through_tokenizer_path(tokenizer, tmp_path):
    folder = tokenizer.save(tmp_path / "tok")
    assert {p.name for p in folder.iterdir()} == {"tokenizer.json", "tokenizer_config.json"}
    loaded = wordpiece_tokenizer(replace(MLM, tokenizer_path=str(folder)), "unused: the folder's tokenizer is read")
    assert loaded.vocabulary() == tokenizer.vocabulary()
    assert loaded.special_ids == tokenizer.special_ids and loaded.mask_id == tokenizer.mask_id
    block = pydoc_text()[:3000]
    assert loaded.encode(block) == tokenizer.encode(block)
    # asked for special tokens, the saved tokenizer puts [CLS] in front, as the windows have it
    assert loaded.tokenizer.encode("lambda").ids[0] == tokenizer.cls_id


def test_a_damaged_tokenizer_folder_is_named(tokenizer, tmp_path):
    folder = tokenizer.save(tmp_path / "tok")
    file = folder / "tokenizer.json"
    text = file.read_text(encoding="utf-8")
    file.write_text(text[: len(text) // 2], encoding="utf-8")  # cut short
    with pytest.raises(ValueError, match=f"{file} is not valid JSON"):
        load_wordpiece(folder)
    file.write_text(json.dumps({"model": "not a tokenizer"}), encoding="utf-8")
    with pytest.raises(ValueError, match=f"{file} does not load as a tokenizer"):
        load_wordpiece(folder)
    file.unlink()
    with pytest.raises(ValueError, match=f"data.tokenizer_path={folder} holds no tokenizer.json"):
        load_wordpiece(folder)
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        load_wordpiece(tmp_path / "missing")
    # a tokenizer without [MASK]
    vocab = [t for t in tokenizer.vocabulary() if t != "[MASK]"]
    build_tokenizer(vocab).save(str(file))
    with pytest.raises(ValueError, match=rf"{file} has no \[MASK\] token"):
        load_wordpiece(folder)


def test_masked_lm_needs_the_wordpiece_tokenizer():
    with pytest.raises(ValueError, match="data.task=masked_lm needs data.tokenizer=wordpiece"):
        pydoc_splits(replace(MLM, tokenizer="char"))


def _windows(tokenizer, n: int, t: int, seed: int = 0) -> torch.Tensor:
    """n windows of [CLS] + random non-special ids, with some [UNK] and [PAD] that must never be chosen."""
    g = torch.Generator().manual_seed(seed)
    windows = torch.randint(len(tokenizer.special_ids), tokenizer.vocab_size, (n, t), generator=g)
    windows[:, 0] = tokenizer.cls_id
    windows[::7, 5] = tokenizer.unk_id
    windows[::5, -3:] = tokenizer.pad_id
    return windows


def test_masking_chooses_fifteen_percent_and_replaces_80_10_10(tokenizer):
    windows = _windows(tokenizer, 4000, 32)
    inputs, targets = Masking.of(tokenizer, 0.15)(windows, torch.Generator().manual_seed(0))
    special = torch.isin(windows, torch.tensor(tokenizer.special_ids))
    chosen = targets != IGNORE_INDEX
    share = chosen.sum() / (~special).sum()
    assert abs(float(share) - 0.15) < 0.005  # 4,000 windows: the share's spread is about 0.001
    assert not (chosen & special).any()  # [CLS], [UNK], [PAD] are never chosen
    assert (chosen.sum(1) >= 1).all()
    assert torch.equal(targets[chosen], windows[chosen])
    assert torch.equal(inputs[~chosen], windows[~chosen])
    masked = inputs[chosen] == tokenizer.mask_id
    kept = inputs[chosen] == windows[chosen]
    swapped = ~masked & ~kept
    n = chosen.sum()
    # about 16,600 chosen positions: each share's spread is below 0.003
    assert abs(float(masked.sum() / n) - 0.8) < 0.015
    assert abs(float(swapped.sum() / n) - 0.1) < 0.015
    assert abs(float(kept.sum() / n) - 0.1) < 0.015
    assert not torch.isin(inputs[chosen][swapped], torch.tensor(tokenizer.special_ids)).any()


def test_a_window_with_one_candidate_still_gets_a_target(tokenizer):
    windows = torch.full((3, 8), tokenizer.pad_id)
    windows[:, 0] = tokenizer.cls_id
    windows[:, 3] = 100
    _, targets = Masking.of(tokenizer, 0.15)(windows, torch.Generator().manual_seed(1))
    assert (targets[:, 3] == 100).all() and (targets != IGNORE_INDEX).sum() == 3


def test_the_windows_start_with_cls_which_is_never_masked(splits, tokenizer):
    train, val, test, _ = splits
    assert isinstance(train, MaskedWindows) and len(train) > 10 * len(test) > 0
    for dataset in (train, val, test):
        inputs, targets = dataset[0]
        assert inputs.shape == targets.shape == (MLM.seq_len,)
        assert inputs.dtype == targets.dtype == torch.long
        assert (dataset.windows[:, 0] == tokenizer.cls_id).all()
        assert (dataset.windows[:, 1:] != tokenizer.cls_id).all()
    inputs, targets = test.fixed
    assert (inputs[:, 0] == tokenizer.cls_id).all() and (targets[:, 0] == IGNORE_INDEX).all()
    chosen = targets != IGNORE_INDEX
    assert (chosen.sum(1) >= 1).all()
    assert torch.equal(targets[chosen], test.windows[chosen])
    assert torch.equal(inputs[~chosen], test.windows[~chosen])


def test_evaluation_masks_are_fixed_and_training_masks_are_drawn_at_every_fetch(splits, tokenizer):
    train, val, test, _ = splits
    again = pydoc_splits(MLM)  # built again: the same masks from data.mask_seed
    for a, b in ((val, again[1]), (test, again[2])):
        assert torch.equal(a.fixed[0], b.fixed[0]) and torch.equal(a.fixed[1], b.fixed[1])
        assert all(torch.equal(x, y) for x, y in zip(a[3], a[3]))  # two fetches
    n = min(len(val), len(test))  # the splits draw from streams of their own
    assert not torch.equal(val.fixed[1][:n] == IGNORE_INDEX, test.fixed[1][:n] == IGNORE_INDEX)
    tokens = test.windows[:, 1:].flatten()  # the test block's tokens, masked from another seed
    other = masked_windows(replace(MLM, mask_seed=1), tokens, tokenizer, "test")
    assert torch.equal(other.windows, test.windows) and not torch.equal(other.fixed[1], test.fixed[1])
    torch.manual_seed(0)
    first = [train[i] for i in range(8)]
    second = [train[i] for i in range(8)]
    assert any(not torch.equal(a[1], b[1]) for a, b in zip(first, second))  # new masks per fetch
    torch.manual_seed(0)
    replay = [train[i] for i in range(8)]  # the global generator's seed fixes them
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(first, replay))
    fixed = train.with_fixed_masks(5)
    assert torch.equal(fixed[2][1], fixed[2][1]) and torch.equal(fixed.windows, train.windows)


@pytest.mark.numeric
def test_the_masked_lm_loss_counts_the_masked_positions_only():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 7, generator=g)
    targets = torch.full((2, 5), IGNORE_INDEX)
    targets[0, 1], targets[0, 4], targets[1, 0] = 3, 6, 2
    targets[1, 2] = int(logits[1, 2].argmax())  # one correct prediction at least
    loss, correct, count = loss_and_correct(logits, targets, "masked_lm")
    counted = [(0, 1), (0, 4), (1, 0), (1, 2)]
    expected = sum(-F.log_softmax(logits[b, t], -1)[targets[b, t]] for b, t in counted)
    assert isinstance(count, torch.Tensor) and int(count) == 4
    assert_close_rel(loss, expected, FEW_OPS, "summed masked-LM loss")
    assert int(correct) == sum(int(logits[b, t].argmax() == targets[b, t]) for b, t in counted)
    # no shift: position t is scored against target t, unlike causal LM
    flat_logits, flat_targets = flat_predictions(logits, targets, "masked_lm")
    assert torch.equal(flat_logits, logits.flatten(0, 1)) and torch.equal(flat_targets, targets.flatten())
    assert flat_predictions(logits, targets, "causal_lm")[1].numel() == 8
    mean = F.cross_entropy(flat_logits, flat_targets, ignore_index=IGNORE_INDEX)  # what training_step takes
    assert_close_rel(mean, expected / 4, FEW_OPS, "mean masked-LM loss")


def test_wordpiece_tokenizer_wraps_any_tokenizer_with_the_special_tokens(tokenizer):
    wrapped = WordPieceTokenizer(tokenizer.tokenizer, source="a test")
    assert wrapped.vocab_size == tokenizer.vocab_size and wrapped.mask_id == 4
