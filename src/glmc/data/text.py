"""Shared pieces of the text datasets: tokenizers, contiguous splits and fixed token windows.

A corpus is split into contiguous train / validation / test blocks (data.val_fraction,
data.test_fraction), each tokenized on its own and cut into non-overlapping windows of data.seq_len
tokens, (inputs, targets) with targets = inputs (the causal-LM loss shifts them; -100 marks padding).
With data.task=masked_lm a window is [CLS] + (seq_len - 1) tokens (glmc.data.masked_lm).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Protocol

import torch
from torch import Tensor
from torch.utils.data import Dataset

from glmc.config import DataConfig
from glmc.data.download import fetching
from glmc.data.tokenizer_folder import RESAVE, check_tokenizer_folder, error_reason
from glmc.metrics import IGNORE_INDEX as IGNORE


class Tokenizer(Protocol):
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...


class CharTokenizer:
    """One id per character of the corpus, in code-point order: the same corpus gives the same ids."""

    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}
        self.vocab_size = len(self.chars)

    def encode(self, text: str) -> list[int]:
        return [self.index[c] for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.chars[i] for i in ids)

    def to_hf(self):
        """The same ids as a Hugging Face fast tokenizer (single characters, no special tokens)."""
        from tokenizers import Regex, models, pre_tokenizers
        from tokenizers import Tokenizer as Fast
        from transformers import PreTrainedTokenizerFast

        fast = Fast(models.WordLevel(vocab=dict(self.index)))
        fast.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # every character alone
        return PreTrainedTokenizerFast(tokenizer_object=fast)


class HFTokenizer:
    """A Hugging Face tokenizer behind the same members, with its special tokens' ids (None where absent)."""

    def __init__(self, tokenizer, source: str = "the tokenizer"):
        self.hf = tokenizer
        self.source = source
        self.vocab_size = len(tokenizer)
        self.eos_id = tokenizer.eos_token_id
        self.cls_id = tokenizer.cls_token_id
        self.mask_id = tokenizer.mask_token_id
        self.pad_id = tokenizer.pad_token_id
        self.special_ids = tuple(sorted(set(tokenizer.all_special_ids)))

    def encode(self, text: str) -> list[int]:
        return self.hf(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids: list[int]) -> str:
        return self.hf.decode(ids)

    def require(self, purpose: str, **tokens: str) -> None:
        """ValueError when a special token `purpose` needs is missing; `tokens`: attribute -> token name."""
        missing = [name for attribute, name in tokens.items() if getattr(self, attribute) is None]
        if missing:
            raise ValueError(
                f"{self.source} has no {' and no '.join(missing)}, which {purpose} needs; use a tokenizer "
                "that has them (data.tokenizer_path)"
            )


def saved_tokenizer(path: str | Path, key: str = "data.tokenizer_path") -> HFTokenizer:
    """The tokenizer saved with save_pretrained in `path` (local files only, no code from the folder)."""
    from transformers import AutoTokenizer

    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{key}={path} is not a folder holding a saved tokenizer")
    check_tokenizer_folder(path, key)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    except Exception as err:
        raise ValueError(f"{key}={path} does not load as a tokenizer ({error_reason(err)}); {RESAVE}") from err
    if len(tokenizer) < 2:
        raise ValueError(f"{key}={path} loads as a tokenizer of {len(tokenizer)} ids; {RESAVE}")
    return HFTokenizer(tokenizer, source=f"the tokenizer of {key}={path}")


def gpt2_tokenizer(cfg: DataConfig) -> HFTokenizer:
    """`data.tokenizer_path` or, with data.download=true, the hub's `gpt2`."""
    from transformers import AutoTokenizer

    if cfg.tokenizer_path:
        return saved_tokenizer(cfg.tokenizer_path)
    if not cfg.download:
        raise FileNotFoundError(
            "data.tokenizer=gpt2 needs data.tokenizer_path=<folder saved with save_pretrained> "
            "or data.download=true on a machine with network"
        )
    instead = "save it with save_pretrained into a folder and set data.tokenizer_path to that folder"
    with fetching("the GPT-2 tokenizer", "the Hugging Face hub (https://huggingface.co/gpt2)", instead):
        return HFTokenizer(AutoTokenizer.from_pretrained("gpt2"))


def make_tokenizer(cfg: DataConfig, corpus: str, training_text: str | None = None) -> Tokenizer:
    """`training_text`: what a trained tokenizer (wordpiece) learns from, the corpus when not given."""
    if cfg.tokenizer == "char":
        return CharTokenizer(corpus)
    if cfg.tokenizer == "gpt2":
        return gpt2_tokenizer(cfg)
    if cfg.tokenizer == "pretrained":
        if not cfg.tokenizer_path:
            raise ValueError("data.tokenizer=pretrained reads the tokenizer saved in data.tokenizer_path: set it")
        return saved_tokenizer(cfg.tokenizer_path)
    if cfg.tokenizer == "wordpiece":
        from glmc.data.wordpiece import wordpiece_tokenizer

        return wordpiece_tokenizer(cfg, corpus if training_text is None else training_text)
    raise ValueError(f"data.tokenizer={cfg.tokenizer!r} is not one of char, gpt2, wordpiece, pretrained")


def split_points(n: int, val_fraction: float, test_fraction: float) -> tuple[int, int]:
    """Where the validation and the test block of a corpus of `n` characters begin."""
    if not (0 < val_fraction < 1 and 0 < test_fraction < 1 and val_fraction + test_fraction < 1):
        raise ValueError(
            f"data.val_fraction={val_fraction} and data.test_fraction={test_fraction} must be in (0, 1) "
            "and leave a training block"
        )
    return round(n * (1 - val_fraction - test_fraction)), round(n * (1 - test_fraction))


def split_text(text: str, val_fraction: float, test_fraction: float) -> tuple[str, str, str]:
    """Contiguous train / validation / test blocks."""
    a, b = split_points(len(text), val_fraction, test_fraction)
    return text[:a], text[a:b], text[b:]


class TokenWindows(Dataset):
    """Non-overlapping windows of `seq_len` tokens; the tail shorter than a window is dropped."""

    def __init__(self, tokens: Tensor, seq_len: int):
        if tokens.numel() < seq_len:
            raise ValueError(f"{tokens.numel()} tokens cannot fill one window of data.seq_len={seq_len}")
        self.windows = tokens[: tokens.numel() // seq_len * seq_len].view(-1, seq_len).clone()

    def __len__(self) -> int:
        return self.windows.shape[0]

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        return self.windows[i], self.windows[i]


class PaddedSequences(Dataset):
    """One example per row, cut or padded to `seq_len` with EOS (targets ignore the padding after the
    first EOS); kept unpadded as flat int32 ids and padded when fetched (BookCorpus: 4 GB, not 600)."""

    def __init__(self, sequences: list[list[int]], seq_len: int, eos_id: int):
        rows = [ids[:seq_len] for ids in sequences]
        flat = torch.tensor([i for ids in rows for i in ids], dtype=torch.int32)
        self._keep(flat, torch.tensor([len(ids) for ids in rows], dtype=torch.long), seq_len, eos_id)

    @classmethod
    def packed(cls, flat: Tensor, lengths: Tensor, seq_len: int, eos_id: int) -> PaddedSequences:
        """Rows as their ids end to end (`flat`) and each row's length, each already cut to `seq_len`."""
        if (lengths.numel() and int(lengths.max()) > seq_len) or int(lengths.sum()) != flat.numel():
            raise ValueError(f"packed rows: lengths must be at most {seq_len} and add up to the {flat.numel()} ids")
        rows = cls.__new__(cls)
        rows._keep(flat.to(torch.int32), lengths.to(torch.long), seq_len, eos_id)
        return rows

    def _keep(self, flat: Tensor, lengths: Tensor, seq_len: int, eos_id: int) -> None:
        self.flat, self.lengths, self.seq_len, self.eos_id = flat, lengths, seq_len, eos_id
        self.starts = torch.cumsum(lengths, 0) - lengths

    def __len__(self) -> int:
        return self.lengths.shape[0]

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        start, n = int(self.starts[i]), int(self.lengths[i])
        inputs = torch.full((self.seq_len,), self.eos_id, dtype=torch.long)
        inputs[:n] = self.flat[start : start + n]
        targets = torch.full((self.seq_len,), IGNORE, dtype=torch.long)
        targets[:n] = inputs[:n]
        if n < self.seq_len:
            targets[n] = self.eos_id
        return inputs, targets


SPLITS = ("train", "validation", "test")


def check_task(cfg: DataConfig, source: str, chars: int) -> None:
    """Refuse an empty corpus, and a masked-LM task without a tokenizer that has [CLS] and [MASK]."""
    if cfg.task == "masked_lm":
        from glmc.data.masked_lm import check_masked_lm_tokenizer

        check_masked_lm_tokenizer(cfg)
    if not chars:
        raise ValueError(f"{source} is empty: it needs at least one window of data.seq_len={cfg.seq_len} per split")


def check_task_tokenizer(cfg: DataConfig, tokenizer: Tokenizer) -> None:
    if cfg.task == "masked_lm" and isinstance(tokenizer, HFTokenizer):  # a saved tokenizer: its own [CLS], [MASK]
        tokenizer.require("data.task=masked_lm", cls_id="classification token ([CLS])", mask_id="mask token")


def token_windows(
    cfg: DataConfig, tokenizer: Tokenizer, name: str, tokens: Tensor, chars: tuple[int, int], source: str
):
    """One split's windows; `chars` (the corpus's and the split's characters) name a split too short."""
    masked = cfg.task == "masked_lm"
    if tokens.numel() < cfg.seq_len - masked:  # a masked-LM window holds [CLS] and seq_len - 1 tokens
        share = min(cfg.val_fraction, cfg.test_fraction)
        raise ValueError(
            f"{source} is too short: {chars[0]} characters, of which the {name} split holds "
            f"{chars[1]} ({tokens.numel()} tokens), fewer than one window of data.seq_len={cfg.seq_len}; "
            f"use a smaller data.seq_len or a corpus of at least about {math.ceil(cfg.seq_len / share)} "
            f"characters (data.val_fraction={cfg.val_fraction}, data.test_fraction={cfg.test_fraction})"
        )
    if masked:
        from glmc.data.masked_lm import masked_windows

        return masked_windows(cfg, tokens, tokenizer, name)
    return TokenWindows(tokens, cfg.seq_len)


def text_splits(cfg: DataConfig, text: str, source: str = "the corpus") -> tuple[Dataset, Dataset, Dataset, Tokenizer]:
    """A whole corpus -> fixed-window train / validation / test sets and the tokenizer."""
    check_task(cfg, source, len(text))
    blocks = split_text(text, cfg.val_fraction, cfg.test_fraction)
    tokenizer = make_tokenizer(cfg, text, training_text=blocks[0])
    check_task_tokenizer(cfg, tokenizer)
    sets = []
    for name, block in zip(SPLITS, blocks):
        tokens = torch.tensor(tokenizer.encode(block), dtype=torch.long)
        sets.append(token_windows(cfg, tokenizer, name, tokens, (len(text), len(block)), source))
    return sets[0], sets[1], sets[2], tokenizer
