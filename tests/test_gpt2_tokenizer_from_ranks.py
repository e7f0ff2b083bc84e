"""benchmarks/gpt2_tokenizer_from_ranks.py on a tiny rank table written here (a few byte tokens and merges):
both rank formats read alike, the merges are the ones byte-pair encoding implies, and the saved folder,
loaded as the pipeline loads data.tokenizer_path, gives the ids plain byte-pair encoding gives."""

from __future__ import annotations

import base64
import json
import sys

import pytest

from glmc.data.text import saved_tokenizer

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import gpt2_tokenizer_from_ranks as builder  # noqa: E402  (a script, importable once its folder is on the path)

# bytes, then merges in the order a BPE trainer would have made them
TOKENS = [b" ", b"!", b"a", b"b", b"c", b"d", b"\xc3", b"\xa9", b"ab", b" a", b"abc", b" ab", b"cd", b"\xc3\xa9"]
RANKS = {token: rank for rank, token in enumerate(TOKENS)}


def write_tiktoken(path):
    path.write_text("".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in RANKS.items()))
    return path


def write_js_module(path):
    first = " ".join(base64.b64encode(t).decode() for t in TOKENS[:8])
    rest = " ".join(base64.b64encode(t).decode() for t in TOKENS[8:])
    obj = {
        "pat_str": builder.GPT2_PATTERN,
        "special_tokens": {"<|endoftext|>": 14},
        "bpe_ranks": f"! 0 {first}\n? 8 {rest}",
    }
    path.write_text(f"export default {json.dumps(obj)};\n")
    return path


def reference_ids(words: list[str]) -> list[int]:
    """Byte-pair encoding of each pre-tokenised word: join the adjacent pair of lowest rank until none is left."""
    ids = []
    for word in words:
        parts = [bytes([b]) for b in word.encode()]
        while True:
            pairs = [(RANKS[a + b], i) for i, (a, b) in enumerate(zip(parts, parts[1:])) if a + b in RANKS]
            if not pairs:
                break
            _, i = min(pairs)
            parts[i : i + 2] = [parts[i] + parts[i + 1]]
        ids += [RANKS[p] for p in parts]
    return ids


def test_both_formats_read_alike_and_merges_follow_the_ranks(tmp_path):
    plain, special, pattern = builder.read_ranks(write_tiktoken(tmp_path / "tiny.tiktoken"))
    js, js_special, js_pattern = builder.read_ranks(write_js_module(tmp_path / "tiny.js"))
    assert plain == js == RANKS and pattern == js_pattern == builder.GPT2_PATTERN
    assert special == {} and js_special == {"<|endoftext|>": 14}  # a plain file has GPT-2's EOS only at full size
    merges = builder.merges_from_ranks(RANKS)
    assert merges == [(b"a", b"b"), (b" ", b"a"), (b"ab", b"c"), (b" ", b"ab"), (b"c", b"d"), (b"\xc3", b"\xa9")]
    table = builder.byte_to_unicode()
    assert len(set(table.values())) == 256 and table[ord(" ")] == "Ġ" and table[ord("a")] == "a"


def test_saved_folder_encodes_as_byte_pair_encoding_does(tmp_path):
    ranks, special, pattern = builder.read_ranks(write_js_module(tmp_path / "tiny.js"))
    folder = tmp_path / "tokenizer"
    files = builder.write_folder(builder.build_tokenizer(ranks, special, pattern), folder, ranks, special)
    assert {"tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"} <= {p.name for p in files}
    assert (folder / "merges.txt").read_text().splitlines()[1:3] == ["a b", "Ġ a"]
    tok = saved_tokenizer(folder)  # the pipeline's reader of data.tokenizer_path
    assert tok.vocab_size == 15 and tok.eos_id == 14
    cases = {
        "abc ab cd!": ["abc", " ab", " cd", "!"],
        "abcd  dab": ["abcd", " ", " dab"],
        "é ab!!": ["é", " ab", "!!"],
    }
    for text, words in cases.items():
        ids = tok.encode(text)
        assert ids == reference_ids(words), text
        assert tok.hf.decode(ids) == text
    assert tok.encode("ab<|endoftext|>") == [8, 14]


def test_a_table_not_made_by_bpe_is_refused(tmp_path):
    with pytest.raises(ValueError, match="not 2"):
        builder.merges_from_ranks({b"a": 0, b"b": 1, b"c": 2, b"abc": 3})  # no pair of lower rank joins to it
    with pytest.raises(ValueError, match="bytes"):
        builder.check_ranks({b"a": 0, b"ab": 1})
    bad = tmp_path / "bad.tiktoken"
    bad.write_text("YQ== 0\nnot a line\n")
    with pytest.raises(ValueError, match="line 2"):
        builder.read_ranks(bad)
