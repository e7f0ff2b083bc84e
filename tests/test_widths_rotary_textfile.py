"""Endpoints of different widths in the grouped-query rotary families (Llama, GPT-NeoX) embed exactly; a
GPT-NeoX head whose rotary share gives an odd count of dims converts as Hugging Face computes it; a text
file is read and tokenized in segments, with memory that grows with its ids alone."""

from __future__ import annotations

import dataclasses
import math
import tracemalloc

import numpy as np
import pytest
import torch
from test_pretrained_endpoints import char_tokenizer

from glmc.config import ModelConfig
from glmc.data.pydoc_corpus import pydoc_text
from glmc.data.text import CharTokenizer, HFTokenizer, split_points, split_text
from glmc.data.text_file import read_token_ids, text_file_splits
from glmc.data.wordpiece import trained_wordpiece
from glmc.matching.weight import WeightMatcher
from glmc.models import to_canonical
from glmc.models.canonical import CanonicalTransformer
from glmc.models.export import to_hf
from glmc.models.families import family_named
from glmc.models.rotary import inverse_frequencies
from glmc.pipeline.validate import ConfigError, validate_config
from glmc.symmetry import SymmetrySpec
from glmc.symmetry.embed_width import RotaryHead, layer_sizes, match_widths, rotary_index

from conftest import compose_config
from family_checks import assert_symmetry_keeps_function
from numeric import FEW_OPS, FORWARD, assert_close_rel, relative_error
from tiny_hf import inputs_for, tiny_gpt_neox, tiny_llama

# ---------------------------------------------------------------- 21: widths of rotary, grouped families

# (narrow, wide) Hugging Face builders: more key/value groups and query heads, a wider head (Llama: all
# dims rotate, 8 -> 16), wider partial rotary heads, an odd rotary count into an even one (3 of 12 -> 6 of
# 24) and one rotating pair into two (1 of 4 -> 2 of 8)
WIDTH_CASES = {
    "llama more groups and query heads": (
        lambda: tiny_llama(hidden=16, heads=2, kv_heads=1, mlp=24),
        lambda: tiny_llama(seed=1, hidden=32, heads=4, kv_heads=2, mlp=48),
    ),
    "llama wider heads": (
        lambda: tiny_llama(hidden=16, heads=2, kv_heads=1, mlp=24),
        lambda: tiny_llama(seed=1, hidden=32, heads=2, kv_heads=1, mlp=48),
    ),
    "gpt_neox more heads, rotary 1/4": (
        lambda: tiny_gpt_neox(hidden=32, heads=2),
        lambda: tiny_gpt_neox(seed=1, hidden=64, heads=4, mlp=96),
    ),
    "gpt_neox odd rotary into wider heads": (
        lambda: tiny_gpt_neox(hidden=24, heads=2),
        lambda: tiny_gpt_neox(seed=1, hidden=48, heads=2, mlp=96),
    ),
    "gpt_neox one pair into two": (
        lambda: tiny_gpt_neox(hidden=16, heads=4),
        lambda: tiny_gpt_neox(seed=1, hidden=32, heads=4, mlp=64),
    ),
}


@pytest.mark.parametrize("case", list(WIDTH_CASES))
def test_a_narrow_rotary_grouped_model_embeds_exactly_into_a_wide_one(case):
    narrow_hf, wide_hf = (build() for build in WIDTH_CASES[case])
    narrow, wide, x = to_canonical(narrow_hf), to_canonical(wide_hf), inputs_for(narrow_hf)
    for stream in ("keep", "rms"):
        embedded = match_widths(wide, narrow, torch.Generator().manual_seed(0), stream)
        pw, pe = wide.params(), embedded.params()
        assert list(pw) == list(pe) and all(pw[k].shape == pe[k].shape for k in pw), case
        assert layer_sizes(embedded) == layer_sizes(wide)
        layout = ("rope_dim", "rotary_dims", "rotary_freq_dim")
        assert [getattr(embedded.config, k) for k in layout] == [getattr(wide.config, k) for k in layout]
        with torch.no_grad():
            assert_close_rel(embedded(x), narrow(x), FORWARD, f"{case} stream={stream}: embedded vs narrow logits")


def test_rotary_dims_go_to_the_wide_pair_of_their_frequency_not_to_the_end():
    """Zero query/key dims appended at the end of a head, as for models without rotary positions, would pair
    dims of different frequencies: the logits change."""
    narrow_hf, wide_hf = (build() for build in WIDTH_CASES["llama wider heads"])
    narrow, wide, x = to_canonical(narrow_hf), to_canonical(wide_hf), inputs_for(narrow_hf)
    embedded = match_widths(wide, narrow, torch.Generator().manual_seed(0))
    index = torch.tensor(rotary_index(RotaryHead(8, 8, 8), RotaryHead(16, 16, 16), None))
    p = dict(embedded.params())
    for layer in range(narrow.num_layers):
        for name, axis in (("q_w", 2), ("q_b", 2), ("k_w", 1), ("k_b", 1)):
            key = f"blocks.{layer}.{name}"
            dims = p[key].index_select(axis, index)  # the narrow head's dims in its own order
            p[key] = torch.cat([dims, torch.zeros_like(dims)], axis)
    naive = CanonicalTransformer(embedded.config, p)
    with torch.no_grad():
        assert relative_error(naive(x), narrow(x))[0] > 1e-2


def test_the_rotary_index_pairs_equal_frequencies_and_refuses_where_none_match():
    # 4 pairs at theta^(-2i/8) onto 8 at theta^(-2j/16): j = 2i, second halves after the 8 first-half dims
    assert rotary_index(RotaryHead(8, 8, 8), RotaryHead(16, 16, 16), None) == [0, 2, 4, 6, 8, 10, 12, 14]
    # GPT-NeoX's odd count 3 (4 dims rotate, at the frequencies of 3) into 6 of 24, pass-through after them
    index = rotary_index(RotaryHead(12, 4, 3), RotaryHead(24, 6, 6), None)
    assert index == [0, 2, 3, 5, *range(6, 14)]
    with pytest.raises(ValueError, match=r"theta\^\(-2/6\).*multiple of 6"):
        rotary_index(RotaryHead(6, 6, 6), RotaryHead(8, 8, 8), None)
    with pytest.raises(ValueError, match="pass 6 dims through unrotated, more than the 4"):
        rotary_index(RotaryHead(8, 2, 2), RotaryHead(8, 4, 4), None)
    with pytest.raises(ValueError, match="'dynamic' computes its frequencies from the count"):
        rotary_index(RotaryHead(8, 8, 8), RotaryHead(16, 16, 16), {"rope_type": "dynamic", "factor": 2.0})


def test_weight_matching_aligns_the_embedded_model_and_keeps_its_function():
    narrow_hf, wide_hf = (build() for build in WIDTH_CASES["llama more groups and query heads"])
    narrow, wide, x = to_canonical(narrow_hf), to_canonical(wide_hf), inputs_for(narrow_hf)
    alignment = WeightMatcher().match(wide, match_widths(wide, narrow, torch.Generator().manual_seed(1)))
    with torch.no_grad():
        assert_close_rel(alignment.model(x), narrow(x), FORWARD, "weight-matched embedded vs narrow")
        assert torch.isfinite(alignment.interpolate(0.5)(x)).all()


def _widths_config(model: str, narrow: str, wide: str = "{hidden_size:32,num_heads:4,mlp_size:64}"):
    return compose_config(
        "debug=fast",
        "logger=none",
        f"model={model}",
        "data=pydoc",
        "data.seq_len=16",
        "seeds=[0,1]",
        "matcher.methods=[weight]",
        f"endpoint_models=[{wide},{narrow}]",
    )


@pytest.mark.parametrize(
    "model,narrow,wide,named",
    [
        ("llama_text", "{hidden_size:24,num_heads:4}", None, r"\(llama\).*model.hidden_size / model.num_heads"),
        ("llama_text", "{hidden_size:16,num_heads:4,num_kv_heads:4}", None, r"\(llama\).*model.num_kv_heads"),
        # 5 of 20 dims rotate at theta^(-2i/5), 6 of 24 at theta^(-2j/6)
        ("pythia_text", "{hidden_size:40,num_heads:2}", "{hidden_size:48,num_heads:2}", r"\(gpt_neox\).*rotary_pct"),
    ],
)
def test_widths_that_cannot_embed_exactly_are_refused_before_training(model, narrow, wide, named):
    cfg = _widths_config(model, narrow, *([wide] if wide else []))
    with pytest.raises(ConfigError, match=r"endpoint_models\[1\] \(seed 1\) " + named):
        validate_config(cfg)


def test_widths_that_embed_pass_the_config_check():
    validate_config(_widths_config("llama_text", "{hidden_size:16,num_heads:2,mlp_size:32,num_kv_heads:1}"))
    validate_config(_widths_config("pythia_text", "{hidden_size:16,num_heads:4,mlp_size:32}"))


# ---------------------------------------------------------------- 22: an odd rotary count (GPT-NeoX)


@pytest.fixture(scope="module")
def odd_neox():
    """Two heads of 12 dims with rotary_pct=0.25: Hugging Face's rotary_ndims is 3."""
    hf = tiny_gpt_neox(hidden=24, heads=2, rotary_pct=0.25)
    return hf, to_canonical(hf), inputs_for(hf)


def test_an_odd_rotary_count_converts_to_what_hugging_face_computes(odd_neox):
    hf, model, x = odd_neox
    assert hf.gpt_neox.layers[0].attention.rotary_ndims == 3
    # its tables: ceil(3 / 2) frequencies theta^(-2i/3), repeated, so 4 dims rotate
    assert torch.equal(hf.gpt_neox.rotary_emb.inv_freq, inverse_frequencies(3, 100.0))
    assert (model.config.rotary_dims, model.config.rotary_freq_dim) == (4, 3)
    with torch.no_grad():
        assert_close_rel(model(x), hf(x).logits, FEW_OPS, "odd rotary: canonical vs HF logits")
        # the frequencies of 4 dims (theta^(-2i/4)) are not Hugging Face's
        other = CanonicalTransformer(dataclasses.replace(model.config, rotary_freq_dim=None), model.params())
        assert relative_error(other(x), hf(x).logits)[0] > 1e-3
        assert_close_rel(to_hf(model, hf)(x).logits, hf(x).logits, FEW_OPS, "odd rotary: exported vs HF logits")


@pytest.mark.parametrize(
    "classes",
    [{"qk": "rotary_scale"}, dict(residual="orthogonal", heads="permutation", qk="rotary_scale", vo="invertible")],
    ids=["qk", "all"],
)
def test_the_rotary_qk_group_keeps_the_function_of_an_odd_rotary_head(odd_neox, classes):
    _, model, x = odd_neox
    space = SymmetrySpec.from_model(model)["qk.0"]
    assert (space.size, space.rotary_dims) == (12, 4)  # pairs (0, 2), (1, 3); dims 4..11 pass through
    assert_symmetry_keeps_function(model, x, classes, f"odd rotary {classes}")


def test_the_fourth_dim_of_an_odd_rotary_head_rotates(odd_neox):
    """Dim 3 (the second dim of pair 1) is rotated by Hugging Face: a rotation mixing it with the first
    pass-through dim 4 (queries and keys alike: orthogonal, so scores of unrotated dims would stay) changes
    the logits, while one mixing two pass-through dims (4, 5) keeps them."""
    _, model, x = odd_neox
    c, s = math.cos(0.7), math.sin(0.7)

    def rotated(i: int, j: int) -> CanonicalTransformer:
        m = torch.eye(12)
        m[i, i], m[i, j], m[j, i], m[j, j] = c, -s, s, c
        p = dict(model.params())
        for name, axis in (("q_w", 2), ("q_b", 2), ("k_w", 1), ("k_b", 1)):
            for layer in range(model.num_layers):
                t = p[f"blocks.{layer}.{name}"]
                p[f"blocks.{layer}.{name}"] = torch.movedim(torch.movedim(t, axis, -1) @ m.T, -1, axis)
        return CanonicalTransformer(model.config, p)

    with torch.no_grad():
        reference = model(x)
        assert_close_rel(rotated(4, 5)(x), reference, FORWARD, "pass-through rotation")
        assert relative_error(rotated(3, 4)(x), reference)[0] > 1e-3


def test_the_family_builds_an_odd_rotary_count_and_refuses_one_beyond_the_head():
    family = family_named("gpt_neox")
    base = dict(family="gpt_neox", vocab_size=20, max_positions=16, num_layers=1, mlp_size=8, rope_theta=100.0)
    hf = family.build(ModelConfig(**base, hidden_size=24, num_heads=2, rotary_pct=0.25))
    assert to_canonical(hf).config.rotary_freq_dim == 3
    with pytest.raises(ValueError, match=r"model.rotary_pct=1.0 rotates 15 dims of each head of 15"):
        family.build(ModelConfig(**base, hidden_size=30, num_heads=2, rotary_pct=1.0))


# ---------------------------------------------------------------- 23: a text file read in segments


def _mixed_text(repeat: int) -> str:
    """Text with multi-byte characters (2, 3 and 4 bytes), runs of blank lines, tabs and CRLF endings."""
    line = "naïve café — ünïcode ✓ 日本語のテキスト 🙂🙂\r\n\n\n\ttabs  and   spaces\n"
    return "\ufeff" + (pydoc_text()[:1500] + line) * repeat


@pytest.fixture(scope="module")
def small_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "mixed.txt"
    path.write_text(_mixed_text(4), encoding="utf-8")
    return path


def _file_text(path) -> str:
    """The file's characters as they are, CRLF included (read_text would translate newlines)."""
    return path.read_bytes().decode("utf-8").removeprefix("\ufeff")


def _tokenizers(text: str) -> dict:
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2TokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([text], vocab_size=400, min_frequency=2)
    return {
        "byte-level BPE": HFTokenizer(GPT2TokenizerFast(tokenizer_object=bpe._tokenizer)),
        "saved character tokenizer": HFTokenizer(char_tokenizer()),
        "char": CharTokenizer(text),
        "wordpiece": trained_wordpiece(text, 300),
    }


@pytest.mark.parametrize("chunk", [5, 7, 100])
def test_a_chunked_read_gives_the_ids_of_the_whole_file(small_file, chunk):
    """Reads of 5 or 7 bytes end inside multi-byte characters and words; segments are cut where the
    tokenizer reads the text alike (a byte-level BPE joins a whitespace run to the word after it)."""
    text = _file_text(small_file)
    points = split_points(len(text), 0.1, 0.1)
    for name, tokenizer in _tokenizers(text).items():
        whole = [tokenizer.encode(block) for block in split_text(text, 0.1, 0.1)]
        read = read_token_ids(small_file, "data.path=mixed.txt", tokenizer, points, chunk)
        assert [r.tolist() for r in read] == whole, f"{name}, reads of {chunk} bytes"
        assert read[0].dtype == np.uint16


def test_text_file_splits_reads_in_segments_as_the_whole_text(small_file):
    cfg = compose_config("data=text_file", f"data.path={small_file}", "data.tokenizer=char", "data.seq_len=16").data
    train, val, test, tokenizer = text_file_splits(cfg, chunk=7)
    text = _file_text(small_file)
    assert tokenizer.chars == sorted(set(text))
    for split, block in zip((train, val, test), split_text(text, cfg.val_fraction, cfg.test_fraction)):
        ids = torch.tensor(tokenizer.encode(block))
        assert split.windows.dtype == torch.long
        assert torch.equal(split.windows, ids[: len(split) * 16].view(-1, 16))


def test_a_trained_wordpiece_learns_the_same_vocabulary_from_segments(small_file):
    cfg = compose_config("data=text_file", f"data.path={small_file}", "data.seq_len=16").data
    cfg.tokenizer, cfg.tokenizer_vocab = "wordpiece", 300
    *_, tokenizer = text_file_splits(cfg, chunk=7)
    text = _file_text(small_file)
    whole = trained_wordpiece(split_text(text, cfg.val_fraction, cfg.test_fraction)[0], 300)
    assert tokenizer.vocabulary() == whole.vocabulary()


def test_a_bad_byte_is_named_at_its_offset_across_reads(tmp_path):
    path = tmp_path / "latin.txt"
    good = "naïve ✓ ".encode() * 3
    path.write_bytes(good + "é".encode("latin-1") + b" more")
    cfg = compose_config("data=text_file", f"data.path={path}", "data.tokenizer=char", "data.seq_len=4").data
    with pytest.raises(ValueError, match=f"is not UTF-8 text: byte 0xe9 at offset {len(good)} of {len(good) + 6}"):
        text_file_splits(cfg, chunk=5)


def test_reading_a_2mb_file_holds_little_more_than_its_ids(tmp_path):
    """Peak Python memory (tracemalloc: strings, lists, numpy arrays) while the file is read and tokenized
    stays below three times the compact ids; the whole text and a list of its ids would take 2 + 16 MB."""
    path = tmp_path / "big.txt"
    path.write_text(_mixed_text(1300), encoding="utf-8")
    assert path.stat().st_size > 2_000_000
    tokenizer = CharTokenizer(_mixed_text(1))
    n = len(_mixed_text(1300)) - 1
    points = split_points(n, 0.05, 0.05)
    tracemalloc.start()
    try:
        ids = read_token_ids(path, "data.path=big.txt", tokenizer, points)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    stored = sum(a.nbytes for a in ids)
    assert sum(a.size for a in ids) == n and stored == 2 * n  # uint16 ids, one per character
    assert peak < 3 * stored, f"peak {peak / 1e6:.1f} MB for {stored / 1e6:.1f} MB of ids"
