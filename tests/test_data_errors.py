"""Damaged or unusable data files fail with a ValueError that names the file and says what is wrong.

Each case writes its files in the real on-disk format (a UTF-8 `input.txt`, a `save_to_disk`
folder, a `save_pretrained` tokenizer folder) and then damages them; nothing is downloaded.
"""

from __future__ import annotations

import shutil

import pytest
from test_text_data import EOS, SENTENCES, setup


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """A small byte-level BPE with GPT-2's EOS token, saved with save_pretrained."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2TokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(SENTENCES, vocab_size=300, min_frequency=1, special_tokens=[EOS])
    path = tmp_path_factory.mktemp("tokenizer")
    GPT2TokenizerFast(tokenizer_object=bpe._tokenizer, eos_token=EOS).save_pretrained(str(path))
    return path


# ---------------------------------------------------------------- tiny_shakespeare's input.txt


def shakespeare(root, content: bytes):
    folder = root / "tiny_shakespeare"
    folder.mkdir()
    (folder / "input.txt").write_bytes(content)
    return folder / "input.txt"


@pytest.mark.parametrize(
    "content, problem",
    [
        (b"", "is empty"),
        # 60 characters: the 5% validation and test blocks hold 3 each, less than one window of 8
        (b"hello world " * 5, "is too short: 60 characters, of which the validation split holds 3"),
        ("caf\xe9 na\xefve ".encode("latin-1") * 200, "is not UTF-8 text: byte 0xe9 at offset 3"),
    ],
    ids=["empty", "short", "latin-1"],
)
def test_unusable_input_txt_is_named(tmp_path, content, problem):
    path = shakespeare(tmp_path, content)
    with pytest.raises(ValueError) as err:
        setup("data=tiny_shakespeare", f"data.root={tmp_path}", "data.seq_len=8")
    print(f"\n  {err.value}")
    assert str(path) in str(err.value) and problem in str(err.value)


def test_input_txt_just_long_enough_loads(tmp_path):
    shakespeare(tmp_path, b"abcdefgh" * 20)  # 160 characters: 8 in each 5% block
    dm = setup("data=tiny_shakespeare", f"data.root={tmp_path}", "data.seq_len=8")
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (18, 1, 1)


# ---------------------------------------------------------------- the saved tokenizer folder


def book_overrides(root, tokenizer):
    return ("data=bookcorpus", f"data.root={root}", f"data.tokenizer_path={tokenizer}", "data.seq_len=16")


def save_book(root, columns: dict):
    from datasets import Dataset

    Dataset.from_dict(columns).save_to_disk(str(root / "bookcorpus"))
    return root / "bookcorpus"


@pytest.mark.parametrize("damage", ["no_files", "config_only", "cut_json"])
def test_broken_tokenizer_folder_is_named(tmp_path, tokenizer_dir, damage):
    save_book(tmp_path, {"text": SENTENCES})
    folder = tmp_path / "tokenizer"
    shutil.copytree(tokenizer_dir, folder)
    named = folder
    if damage == "no_files":
        for file in folder.iterdir():
            file.unlink()
    elif damage == "config_only":  # transformers would build an empty tokenizer from the config alone
        (folder / "tokenizer.json").unlink()
    else:
        named = folder / "tokenizer.json"
        named.write_text(named.read_text()[:100])
    with pytest.raises(ValueError) as err:
        setup(*book_overrides(tmp_path, folder))
    print(f"\n  {damage}: {err.value}")
    message = str(err.value)
    assert str(named) in message and "save_pretrained" in message
    assert ("is not valid JSON" if damage == "cut_json" else "holds no saved tokenizer") in message


# ---------------------------------------------------------------- bookcorpus's save_to_disk folder


def test_truncated_arrow_file_is_named(tmp_path, tokenizer_dir):
    folder = save_book(tmp_path, {"text": SENTENCES * 10})
    (arrow,) = folder.glob("*.arrow")
    arrow.write_bytes(arrow.read_bytes()[: arrow.stat().st_size // 2])
    with pytest.raises(ValueError) as err:
        setup(*book_overrides(tmp_path, tokenizer_dir))
    print(f"\n  {err.value}")
    assert str(arrow) in str(err.value) and "damaged Arrow file" in str(err.value)


@pytest.mark.parametrize(
    "columns, problem",
    [
        ({"text": []}, "holds no data files"),  # save_to_disk writes no shard for 0 rows
        ({"sentence": SENTENCES}, "has columns ['sentence'], not a 'text' column"),
        ({"text": list(range(len(SENTENCES)))}, "the 'text' column holds Value('int64'), not text"),
        ({"text": SENTENCES[:2]}, "the val split of the 2 rows of"),
    ],
    ids=["zero_rows", "no_text_column", "int_text_column", "too_few_rows"],
)
def test_unusable_saved_dataset_is_named(tmp_path, tokenizer_dir, columns, problem):
    folder = save_book(tmp_path, columns)
    with pytest.raises(ValueError) as err:
        setup(*book_overrides(tmp_path, tokenizer_dir))
    print(f"\n  {err.value}")
    assert str(folder) in str(err.value) and problem in str(err.value)
