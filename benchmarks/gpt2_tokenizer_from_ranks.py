"""Build a Hugging Face GPT-2 tokenizer folder offline from a byte-pair-encoding rank table.

    .venv/bin/python benchmarks/gpt2_tokenizer_from_ranks.py RANKS OUT_DIR

OUT_DIR then holds what `save_pretrained` writes for GPT-2's fast tokenizer (tokenizer.json,
tokenizer_config.json, special_tokens_map.json) and the slow tokenizer's vocab.json and merges.txt; point
`data.tokenizer_path` at it (the Tiny Shakespeare and BookCorpus columns of paper 001 use GPT-2's tokenizer).

RANKS is one of:
  * a tiktoken rank file (GPT-2's table is `r50k_base.tiktoken`): one line per token, its bytes in base64,
    a space and its rank. The `tiktoken` Python package fetches that file the first time
    `tiktoken.get_encoding("r50k_base")` (or "gpt2") runs and keeps it in its cache folder
    (TIKTOKEN_CACHE_DIR; the file is named by a hash of where it came from): copy it from there.
  * the ranks module of the `js-tiktoken` package, `dist/ranks/gpt2.js` (or .cjs / a .json of the same
    object), which is what `npm pack js-tiktoken` unpacks: a JSON object whose `bpe_ranks` string holds
    lines "<tag> <first rank> <base64 token> <base64 token> ..." (ranks counting up from the first), with
    `special_tokens` and the pre-tokenising `pat_str` beside it.

The vocabulary maps each token's bytes to text with GPT-2's byte-to-unicode table. The merges are derived
from the ranks: a token of two or more bytes is the merge of the two parts that byte-pair encoding, using
only tokens of lower rank, reduces its bytes to (exactly two parts for a table made by BPE; anything else
is an error naming the token). Special tokens (GPT-2: <|endoftext|> = 50256) follow the ranks. With the
full GPT-2 table the result is checked against ids GPT-2's tokenizer is known to give ("Hello world" ->
[15496, 995]).
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from pathlib import Path

# GPT-2's pre-tokenising pattern; the ByteLevel pre-tokenizer of `tokenizers` applies the same one
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
GPT2_RANKS = 50256  # byte-level tokens and merges of GPT-2's table; <|endoftext|> is id 50256
EOS = "<|endoftext|>"
KNOWN_IDS = {"Hello world": [15496, 995], " the": [262], "<|endoftext|>": [50256]}


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from the 256 byte values to printable characters: the printable Latin-1
    bytes stand for themselves, every other byte for the next unused code point from 256 on."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def read_ranks(path: Path) -> tuple[dict[bytes, int], dict[str, int], str]:
    """(token bytes -> rank, special token -> id, pre-tokenising pattern) from either format."""
    text = Path(path).read_text(encoding="utf-8")
    if "bpe_ranks" in text:  # js-tiktoken: `export default {...};`, `module.exports = {...};` or bare JSON
        try:
            obj = json.loads(text[text.index("{") : text.rindex("}") + 1])
        except ValueError as err:
            raise ValueError(f"{path}: no JSON object with a bpe_ranks string in it ({err})") from None
        ranks: dict[bytes, int] = {}
        for line in filter(None, obj["bpe_ranks"].split("\n")):
            _, first, *tokens = line.split(" ")
            for i, token in enumerate(tokens):
                ranks[base64.b64decode(token)] = int(first) + i
        return ranks, dict(obj.get("special_tokens", {})), obj.get("pat_str", GPT2_PATTERN)
    ranks = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except ValueError:
            raise ValueError(f"{path}, line {number}: expected '<base64 token> <rank>', got {line[:80]!r}") from None
    return ranks, ({EOS: len(ranks)} if len(ranks) == GPT2_RANKS else {}), GPT2_PATTERN


def check_ranks(ranks: dict[bytes, int]) -> None:
    """Ranks must number the tokens 0 .. n-1, and every byte of a longer token must be a token itself."""
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError("the ranks are not 0, 1, ..., n-1 (one per token): not a BPE rank table")
    singles = {t[0] for t in ranks if len(t) == 1}
    missing = sorted({b for t in ranks for b in t} - singles)
    if missing:
        raise ValueError(f"bytes {missing[:10]} occur in tokens but are not tokens themselves: cannot derive merges")


def split_by_lower_ranks(token: bytes, ranks: dict[bytes, int]) -> list[bytes]:
    """Byte-pair encoding of `token` with the merges of tokens ranked below it: repeatedly join the adjacent
    pair whose join has the lowest rank, stopping before `token` itself."""
    limit = ranks[token]
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 1:
        best, where = None, -1
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and rank < limit and (best is None or rank < best):
                best, where = rank, i
        if best is None:
            break
        parts[where : where + 2] = [parts[where] + parts[where + 1]]
    return parts


def merges_from_ranks(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """One merge per token of two or more bytes, in rank order (the order BPE applies them)."""
    merges = []
    for token in sorted((t for t in ranks if len(t) > 1), key=ranks.__getitem__):
        parts = split_by_lower_ranks(token, ranks)
        if len(parts) != 2:
            raise ValueError(
                f"token {token!r} (rank {ranks[token]}) reduces to {len(parts)} parts with the lower-ranked "
                "merges, not 2: not a table made by byte-pair encoding"
            )
        merges.append((parts[0], parts[1]))
    return merges


def build_tokenizer(ranks: dict[bytes, int], special: dict[str, int], pattern: str = GPT2_PATTERN):
    """GPT-2's fast tokenizer (byte-level BPE) for the table, as a transformers tokenizer object."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import GPT2TokenizerFast

    check_ranks(ranks)
    expected = list(range(len(ranks), len(ranks) + len(special)))
    if sorted(special.values()) != expected:
        raise ValueError(f"special tokens {special} must take the ids after the ranks ({expected})")
    text = byte_to_unicode()
    as_text = lambda token: "".join(text[b] for b in token)  # noqa: E731
    vocab = {as_text(t): r for t, r in ranks.items()} | special
    merges = [(as_text(a), as_text(b)) for a, b in merges_from_ranks(ranks)]
    fast = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    if pattern == GPT2_PATTERN:
        fast.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:  # another table's pattern: split by it, then map bytes as GPT-2 does
        fast.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
                pre_tokenizers.ByteLevel(False, use_regex=False),
            ]
        )
    fast.decoder = decoders.ByteLevel()
    fast.post_processor = processors.ByteLevel(trim_offsets=False)
    eos = EOS if EOS in special else None
    fast.add_special_tokens(sorted(special, key=special.__getitem__))
    length = 1024 if len(ranks) == GPT2_RANKS else int(1e30)  # GPT-2's context, as its own tokenizer says
    return GPT2TokenizerFast(
        tokenizer_object=fast, bos_token=eos, eos_token=eos, unk_token=eos, model_max_length=length
    )


def write_folder(tokenizer, out: Path, ranks: dict[bytes, int], special: dict[str, int]) -> list[Path]:
    """save_pretrained's files, plus vocab.json and merges.txt (the slow tokenizer's pair of files)."""
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(out))
    text = byte_to_unicode()
    as_text = lambda token: "".join(text[b] for b in token)  # noqa: E731
    vocab = {as_text(t): r for t, r in sorted(ranks.items(), key=lambda kv: kv[1])} | special
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    lines = ["#version: 0.2", *(f"{as_text(a)} {as_text(b)}" for a, b in merges_from_ranks(ranks))]
    (out / "merges.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return sorted(out.iterdir())


def check_known_ids(folder: Path) -> list[str]:
    """Problems with the saved folder, read back as the pipeline reads it: GPT-2's known ids, a round trip."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    problems = [
        f"{text!r} -> {tok(text, add_special_tokens=False)['input_ids']}, GPT-2 gives {ids}"
        for text, ids in KNOWN_IDS.items()
        if tok(text, add_special_tokens=False)["input_ids"] != ids
    ]
    sample = "First Citizen:\nBefore we proceed any further, hear me speak.  Ünïcödé 123"
    if tok.decode(tok(sample, add_special_tokens=False)["input_ids"]) != sample:
        problems.append("decoding does not give the text back")
    if len(tok) != GPT2_RANKS + 1 or tok.eos_token_id != GPT2_RANKS:
        problems.append(f"{len(tok)} ids and EOS {tok.eos_token_id}, GPT-2 has 50257 and EOS 50256")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ranks", type=Path, help="r50k_base.tiktoken, or js-tiktoken's dist/ranks/gpt2.js")
    parser.add_argument("out", type=Path, help="the tokenizer folder to write (data.tokenizer_path)")
    args = parser.parse_args(argv)
    ranks, special, pattern = read_ranks(args.ranks)
    tokenizer = build_tokenizer(ranks, special, pattern)
    for path in write_folder(tokenizer, args.out, ranks, special):
        print(f"wrote {path}")
    if len(ranks) != GPT2_RANKS:
        print(f"{len(ranks)} ranks (GPT-2's table has {GPT2_RANKS}): GPT-2's known ids not checked")
        return 0
    problems = check_known_ids(args.out)
    for problem in problems:
        print(f"MISMATCH: {problem}", file=sys.stderr)
    if not problems:
        print(f"GPT-2's known ids check out ({', '.join(f'{t!r} -> {i}' for t, i in KNOWN_IDS.items())})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
