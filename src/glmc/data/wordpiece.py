"""BERT-style WordPiece tokenizer: trained on a corpus's training block, or loaded from a folder holding
`tokenizer.json` (`data.tokenizer_path`).

The vocabulary is learned here, not by `tokenizers.trainers.WordPieceTrainer`, whose ties depend on
hash-map order (huggingface/tokenizers issue 1794): merges go by count, then by the pieces' text, so the
same corpus gives the same ids on every machine. Case and accents are kept (Python is case-sensitive).
Ids 0-4 are [PAD] [UNK] [CLS] [SEP] [MASK]; `encode` adds no special tokens.
"""

from __future__ import annotations

import heapq
import json
from collections import Counter, defaultdict
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

from glmc.config import DataConfig
from glmc.data.tokenizer_folder import check_tokenizer_folder, error_reason

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
PREFIX = "##"  # marks a piece that continues a word
MIN_PAIR_COUNT = 2  # a pair seen once only memorises one word
TRAINER_VERSION = 1  # bumped when the training rules change the vocabulary (part of the endpoint cache key)
FILE = "tokenizer.json"
SAVE_AGAIN = "save it there again with WordPieceTokenizer.save (or save_pretrained of a fast tokenizer)"


def _pipeline():
    """BERT's normaliser (case and accents kept) and word splitting."""
    from tokenizers import normalizers, pre_tokenizers

    normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=False, lowercase=False
    )
    return normalizer, pre_tokenizers.BertPreTokenizer()


def word_counts(text: str) -> Counter:
    """How often each word occurs in `text`, after the tokenizer's own normalising and splitting."""
    normalizer, pre_tokenizer = _pipeline()
    return Counter(word for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text)))


def _merge(pieces: list[str], a: str, b: str, merged: str) -> list[str]:
    out, i = [], 0
    while i < len(pieces):
        if i + 1 < len(pieces) and pieces[i] == a and pieces[i + 1] == b:
            out.append(merged)
            i += 2
        else:
            out.append(pieces[i])
            i += 1
    return out


def learn_vocabulary(counts: dict[str, int], size: int) -> list[str]:
    """The pieces in id order: the special tokens, the alphabet, then the merges in learned order."""
    words = sorted(counts)
    freq = [counts[w] for w in words]
    pieces = [[w[0], *(PREFIX + c for c in w[1:])] for w in words]
    chars = sorted({c for w in words for c in w})
    vocab = [*SPECIAL_TOKENS, *chars, *(PREFIX + c for c in chars)]
    if len(vocab) > size:
        raise ValueError(
            f"data.tokenizer_vocab={size} is smaller than the {len(vocab)} ids that the special tokens and the "
            f"{len(chars)} characters of the training text need (each as a word start and a continuation); "
            f"use data.tokenizer_vocab>={len(vocab)}"
        )
    known = set(vocab)
    pair_count: Counter = Counter()
    holders: defaultdict[tuple[str, str], set[int]] = defaultdict(set)  # a superset: stale entries are harmless
    for i, p in enumerate(pieces):
        for pair in zip(p, p[1:]):
            pair_count[pair] += freq[i]
            holders[pair].add(i)
    # the most frequent pair first, ties by the pieces' text; entries whose count changed are skipped
    heap = [(-n, pair) for pair, n in pair_count.items()]
    heapq.heapify(heap)
    while len(vocab) < size and heap:
        negative, pair = heapq.heappop(heap)
        if pair_count.get(pair, 0) != -negative:
            continue
        if -negative < MIN_PAIR_COUNT:
            break
        a, b = pair
        merged = a + b[len(PREFIX) :]
        touched = set()
        for i in sorted(holders.pop(pair)):
            old = pieces[i]
            new = _merge(old, a, b, merged)
            if new == old:
                continue
            for q in zip(old, old[1:]):
                pair_count[q] -= freq[i]
                touched.add(q)
            for q in zip(new, new[1:]):
                pair_count[q] += freq[i]
                holders[q].add(i)
                touched.add(q)
            pieces[i] = new
        del pair_count[pair]
        for q in sorted(touched - {pair}):
            if pair_count[q] > 0:
                heapq.heappush(heap, (-pair_count[q], q))
        if merged not in known:
            known.add(merged)
            vocab.append(merged)
    return vocab


def build_tokenizer(vocab: Iterable[str]):
    """A `tokenizers.Tokenizer` encoding with `vocab` (ids in its order)."""
    from tokenizers import Tokenizer, decoders, models, processors

    ids = {piece: i for i, piece in enumerate(vocab)}
    tokenizer = Tokenizer(models.WordPiece(vocab=ids, unk_token="[UNK]", continuing_subword_prefix=PREFIX))
    tokenizer.normalizer, tokenizer.pre_tokenizer = _pipeline()
    tokenizer.decoder = decoders.WordPiece(prefix=PREFIX)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A",
        pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])],
    )
    return tokenizer


class WordPieceTokenizer:
    """The project's tokenizer interface over a `tokenizers.Tokenizer`, with its special tokens' ids."""

    def __init__(self, tokenizer, source: str = "the tokenizer"):
        ids = {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}
        missing = [token for token, i in ids.items() if i is None]
        if missing:
            raise ValueError(
                f"{source} has no {', '.join(missing)} token: data.tokenizer=wordpiece needs all of "
                f"{', '.join(SPECIAL_TOKENS)}; train one (leave data.tokenizer_path unset) or {SAVE_AGAIN}"
            )
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.get_vocab_size()
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (ids[t] for t in SPECIAL_TOKENS)
        self.special_ids = tuple(sorted(ids.values()))

    def encode(self, text: str) -> list[int]:
        """The pieces' ids, without special tokens."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Iterable[int]) -> str:
        """Text from ids; special tokens are written out ([MASK] shows where a token was hidden)."""
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def vocabulary(self) -> list[str]:
        """The pieces in id order."""
        return [self.tokenizer.id_to_token(i) for i in range(self.vocab_size)]

    def save(self, folder: str | Path) -> Path:
        """Write tokenizer.json and a tokenizer_config.json (for AutoTokenizer); returns the folder."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.tokenizer.save(str(folder / FILE))
        names = ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token")
        config = {"tokenizer_class": "PreTrainedTokenizerFast", **dict(zip(names, SPECIAL_TOKENS))}
        (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        return folder


@lru_cache(maxsize=4)
def trained_wordpiece(text: str, vocab_size: int) -> WordPieceTokenizer:
    """The WordPiece tokenizer of `text`, kept per process."""
    return WordPieceTokenizer(build_tokenizer(learn_vocabulary(word_counts(text), vocab_size)))


def load_wordpiece(path: str | Path) -> WordPieceTokenizer:
    """The tokenizer saved in `path` (its tokenizer.json); errors name the folder or the file."""
    from tokenizers import Tokenizer

    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"data.tokenizer_path={path} is not a folder holding a saved tokenizer")
    file = path / FILE
    if not file.is_file():
        present = sorted(p.name for p in path.iterdir())
        raise ValueError(
            f"data.tokenizer_path={path} holds no {FILE} (it holds {present or 'nothing'}): "
            f"data.tokenizer=wordpiece reads {FILE}; {SAVE_AGAIN}"
        )
    check_tokenizer_folder(path)  # a file that is not JSON: the error names it
    try:
        tokenizer = Tokenizer.from_file(str(file))
    except Exception as err:  # the library's own error types; the message names the file
        raise ValueError(f"{file} does not load as a tokenizer ({error_reason(err)}); {SAVE_AGAIN}") from err
    return WordPieceTokenizer(tokenizer, source=str(file))


def wordpiece_tokenizer(cfg: DataConfig, training_text: str) -> WordPieceTokenizer:
    """`data.tokenizer_path` when set, else one trained on `training_text` (data.tokenizer_vocab ids)."""
    if cfg.tokenizer_path:
        return load_wordpiece(cfg.tokenizer_path)
    return trained_wordpiece(training_text, int(cfg.tokenizer_vocab))
