"""BookCorpus: a folder `<data.root>/bookcorpus` written by `save_to_disk` (fetched from the hub once with
data.download=true), one sentence per row of a "text" column. The rows are split by their order (test
last), tokenized with GPT-2's tokenizer and padded with EOS to data.seq_len when fetched.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from glmc.config import DataConfig
from glmc.data.download import fetching
from glmc.data.text import HFTokenizer, PaddedSequences, make_tokenizer, split_text
from glmc.data.tokenizer_folder import error_reason

CHUNK = 10_000  # rows per tokenizer call: fast batch encoding without one huge list of lists


def bookcorpus_dataset(cfg: DataConfig):
    """The saved dataset under `<data.root>/bookcorpus`, downloading it first where allowed."""
    import datasets

    path = Path(cfg.root) / "bookcorpus"
    if not path.is_dir():
        if not cfg.download:
            raise FileNotFoundError(
                f"{path} is missing: set data.root to the folder holding bookcorpus/ (saved with "
                "save_to_disk) or data.download=true on a machine with network"
            )
        partial = path.with_name(path.name + ".part")
        instead = f"save the dataset with save_to_disk to {path} (data.root={cfg.root}) and set data.download=false"
        with fetching("BookCorpus", "the Hugging Face hub (https://huggingface.co/datasets/bookcorpus)", instead):
            datasets.load_dataset("bookcorpus", split="train").save_to_disk(str(partial))
        partial.rename(path)  # a broken save never looks like the corpus
    data = load_saved(path)
    if isinstance(data, datasets.DatasetDict):
        if "train" not in data:
            raise ValueError(f"{path} holds splits {list(data)}, not a 'train' split")
        data = data["train"]
    if "text" not in data.column_names:
        raise ValueError(f"{path} has columns {data.column_names}, not a 'text' column")
    feature = data.features["text"]
    if not isinstance(feature, datasets.Value) or feature.dtype not in ("string", "large_string"):
        raise ValueError(f"{path}: the 'text' column holds {feature}, not text (one string per row)")
    if len(data) == 0:
        raise ValueError(f"{path} holds 0 rows: {RESAVE}")
    return data


RESAVE = "save the corpus there again with save_to_disk (or remove the folder and set data.download=true)"


def load_saved(path: Path):
    """`datasets.load_from_disk`, with a ValueError naming the folder, or its damaged file, where that fails."""
    import datasets

    try:
        return datasets.load_from_disk(str(path))
    except Exception as err:
        shards = sorted(path.rglob("*.arrow"))
        if not shards:
            raise ValueError(
                f"{path} holds no data files (.arrow): a dataset saved with 0 rows, or not a folder written "
                f"by save_to_disk ({error_reason(err)}); {RESAVE}"
            ) from None
        for shard in shards:
            problem = _unreadable_arrow(shard)
            if problem:
                raise ValueError(f"{shard} is a damaged Arrow file ({problem}); {RESAVE}") from None
        raise ValueError(
            f"{path} does not load as a dataset saved with save_to_disk ({error_reason(err)}); {RESAVE}"
        ) from None


def _unreadable_arrow(path: Path) -> str | None:
    """Why the Arrow stream at `path` does not read to its end, or None when it does."""
    import pyarrow as pa

    try:
        with pa.memory_map(str(path)) as source:
            pa.ipc.open_stream(source).read_all()
    except Exception as err:
        return error_reason(err)
    return None


def encode_rows(tokenizer: HFTokenizer, texts: list[str], seq_len: int) -> tuple[Tensor, Tensor]:
    """The rows' ids cut to `seq_len`, end to end (int32), and each row's length, tokenized by chunks."""
    flat, lengths = [], []
    for start in range(0, len(texts), CHUNK):
        batch = [
            row[:seq_len] for row in tokenizer.hf(texts[start : start + CHUNK], add_special_tokens=False)["input_ids"]
        ]
        lengths.append(np.fromiter((len(row) for row in batch), dtype=np.int64, count=len(batch)))
        flat.append(np.fromiter(itertools.chain.from_iterable(batch), dtype=np.int32, count=int(lengths[-1].sum())))
    join = lambda parts, dtype: torch.from_numpy(np.concatenate(parts) if parts else np.zeros(0, dtype))
    return join(flat, np.int32), join(lengths, np.int64)


def bookcorpus_splits(cfg: DataConfig):
    if cfg.tokenizer not in ("gpt2", "pretrained"):
        raise ValueError(f"data.tokenizer={cfg.tokenizer!r}: bookcorpus needs data.tokenizer=gpt2")
    tokenizer = make_tokenizer(cfg, "")
    tokenizer.require("data=bookcorpus (its rows are padded with EOS)", eos_id="end-of-text token (EOS)")
    data = bookcorpus_dataset(cfg)
    # split_text slices anything with len(): on a range it gives contiguous row ranges
    blocks = split_text(range(len(data)), cfg.val_fraction, cfg.test_fraction)
    sets = []
    for name, rows, limit in zip(("train", "val", "test"), blocks, (cfg.limit_train, cfg.limit_test, cfg.limit_test)):
        if len(rows) == 0:
            raise ValueError(
                f"the {name} split of the {len(data)} rows of {Path(cfg.root) / 'bookcorpus'} is empty with "
                f"data.val_fraction={cfg.val_fraction} and data.test_fraction={cfg.test_fraction}"
            )
        if limit is not None:
            rows = rows[:limit]  # before tokenizing: small runs never touch the whole corpus
        texts = data[rows.start : rows.stop]["text"]
        sets.append(PaddedSequences.packed(*encode_rows(tokenizer, texts, cfg.seq_len), cfg.seq_len, tokenizer.eos_id))
    return sets[0], sets[1], sets[2], tokenizer
