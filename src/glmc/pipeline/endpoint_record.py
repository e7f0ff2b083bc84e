"""What the endpoint stage (glmc.pipeline.endpoints) hands the stages after it: one endpoint, trained or
read from the cache or from a model folder."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from glmc.models.canonical import CanonicalTransformer


@dataclass
class Endpoint:
    seed: int  # endpoints=pretrained: the folder's index in endpoints.paths
    model: torch.nn.Module  # as trained (HF)
    canonical: CanonicalTransformer  # the same function in canonical factored form
    test_loss: float
    test_accuracy: float | None
    cached: bool
    name: str | None = None  # endpoints=pretrained: the folder's name, its label in results
    path: str | None = None  # endpoints=pretrained: the folder
    kept: dict[str, Any] | None = None  # early stopping: the epoch whose weights these are, and its val_loss
    # the dtype its weights are stored in (a folder's; trained endpoints are trained and cached in float32);
    # the model itself is float32 either way
    dtype: str = "float32"

    @property
    def label(self) -> str:
        """How results, file names and the report name the endpoint: its seed, or its folder's name."""
        return str(self.seed) if self.name is None else self.name
