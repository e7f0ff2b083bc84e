"""Masked-LM windows (BERT's objective): [CLS] followed by `data.seq_len - 1` tokens of a text block.

Of a window's non-special positions a share `data.mask_prob` is chosen (at least one; stochastic
rounding keeps the expectation exact): 80 % show [MASK], 10 % a random token, 10 % their own. Targets
hold the original id at the chosen positions and IGNORE_INDEX elsewhere. Training windows draw new masks
at every fetch (torch's global generator); validation and test masks are drawn once from `data.mask_seed`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.utils.data import Dataset

from glmc.metrics import IGNORE_INDEX

MASK_SHARE, RANDOM_SHARE = 0.8, 0.1  # of the chosen positions; the rest keep their token
# each split's fixed masks come from their own stream (mask_seed < 2^32: no split repeats another's)
SPLIT_STREAMS = {"validation": 0, "test": 1, "train": 2}


def split_mask_seed(mask_seed: int, split: str) -> int:
    return int(mask_seed) + SPLIT_STREAMS[split] * 2**32


@dataclass(frozen=True)
class Masking:
    """BERT's masking for one tokenizer: `special` marks the ids never chosen nor drawn as replacements."""

    special: Tensor  # (vocab_size,) bool
    mask_id: int
    prob: float

    @classmethod
    def of(cls, tokenizer, prob: float) -> Masking:
        if not 0 < prob < 1:
            raise ValueError(f"data.mask_prob={prob}: use a share in (0, 1) (BERT: 0.15)")
        special = torch.zeros(tokenizer.vocab_size, dtype=torch.bool)
        special[list(tokenizer.special_ids)] = True
        return cls(special, int(tokenizer.mask_id), float(prob))

    def __call__(self, windows: Tensor, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """(inputs, targets) for windows (N, T); the draws depend on the shapes alone, not the tokens."""
        n, t = windows.shape
        candidate = ~self.special[windows]
        available = candidate.sum(1)
        # stochastic rounding: the expected number chosen is exactly prob * available
        count = (available * self.prob + torch.rand(n, generator=generator)).floor().long()
        count = torch.minimum(count.clamp(min=1), available)
        score = torch.rand(n, t, generator=generator).masked_fill(~candidate, 2.0)  # non-candidates rank last
        chosen = score.argsort(1).argsort(1) < count[:, None]
        action = torch.rand(n, t, generator=generator)
        replacements = (~self.special).nonzero().flatten()
        random_ids = replacements[torch.randint(len(replacements), (n, t), generator=generator)]
        inputs = windows.clone()
        inputs[chosen & (action < MASK_SHARE)] = self.mask_id
        swap = chosen & (action >= MASK_SHARE) & (action < MASK_SHARE + RANDOM_SHARE)
        inputs[swap] = random_ids[swap]
        targets = torch.where(chosen, windows, torch.full_like(windows, IGNORE_INDEX))
        return inputs, targets


class MaskedWindows(Dataset):
    """[CLS] + (seq_len - 1) token windows, masked at every fetch (`mask_seed=None`) or once from `mask_seed`."""

    def __init__(self, tokens: Tensor, seq_len: int, tokenizer, mask_prob: float, mask_seed: int | None = None):
        body = seq_len - 1
        if body < 1:
            raise ValueError(f"data.seq_len={seq_len}: a masked-LM window needs [CLS] and at least one token")
        if tokens.numel() < body:
            raise ValueError(
                f"{tokens.numel()} tokens cannot fill one window of data.seq_len={seq_len} ([CLS] + {body} tokens)"
            )
        self.masking = Masking.of(tokenizer, mask_prob)
        count = tokens.numel() // body
        text = tokens[: count * body].view(count, body)
        self.windows = torch.cat([torch.full((count, 1), tokenizer.cls_id, dtype=torch.long), text], 1)
        self.fixed: tuple[Tensor, Tensor] | None = None
        if mask_seed is not None:
            self.fixed = self.masking(self.windows, torch.Generator().manual_seed(mask_seed))

    def __len__(self) -> int:
        return self.windows.shape[0]

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        if self.fixed is not None:
            return self.fixed[0][i], self.fixed[1][i]
        inputs, targets = self.masking(self.windows[i : i + 1])
        return inputs[0], targets[0]

    def with_fixed_masks(self, mask_seed: int) -> MaskedWindows:
        """The same windows with masks drawn once from `mask_seed` (every λ of a path sees the same inputs)."""
        fixed = object.__new__(MaskedWindows)
        fixed.windows, fixed.masking = self.windows, self.masking
        fixed.fixed = self.masking(self.windows, torch.Generator().manual_seed(mask_seed))
        return fixed


def check_masked_lm_tokenizer(cfg) -> None:
    """data.task=masked_lm needs [CLS] and [MASK]: WordPiece has them, a saved one is checked at load."""
    if str(cfg.tokenizer) not in ("wordpiece", "pretrained"):
        raise ValueError(
            f"data.task=masked_lm needs data.tokenizer=wordpiece: its windows start with [CLS] and hide tokens "
            f"behind [MASK], which data.tokenizer={cfg.tokenizer} does not have"
        )


def masked_windows(cfg, tokens: Tensor, tokenizer, split: str) -> MaskedWindows:
    """One split's windows: the training split masked at every fetch, the others once from data.mask_seed."""
    seed = None if split == "train" else split_mask_seed(cfg.mask_seed, split)
    return MaskedWindows(tokens, cfg.seq_len, tokenizer, cfg.mask_prob, seed)
