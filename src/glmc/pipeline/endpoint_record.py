"""What the endpoint stage (glmc.pipeline.endpoints) hands the stages after it: one endpoint, trained or
read from the cache or from a model folder."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from glmc.models.canonical import CanonicalTransformer


@dataclass
class Endpoint:
    seed: int  # endpoints=pretrained: the folder's index in endpoints.paths
    held_model: torch.nn.Module | None  # as trained (HF); None where `forms` builds it when asked
    held_canonical: CanonicalTransformer | None  # the same function in canonical factored form (or None: forms)
    test_loss: float
    test_accuracy: float | None
    cached: bool
    name: str | None = None  # endpoints=pretrained: the folder's name, its label in results
    path: str | None = None  # endpoints=pretrained: the folder
    kept: dict[str, Any] | None = None  # early stopping: the epoch whose weights these are, and its val_loss
    # the dtype its weights are stored in (a folder's; trained endpoints are trained and cached in float32);
    # the model itself is float32 either way
    dtype: str = "float32"
    # a large folder's forms, built on each use (glmc.pipeline.endpoint_forms.FolderForms): each stage then
    # holds only the form it uses, for as long as it uses it
    forms: Any = None
    logits: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)  # an evaluator's -> first logits

    @property
    def model(self) -> torch.nn.Module:
        return self.held_model if self.held_model is not None else self.forms.model()

    @property
    def canonical(self) -> CanonicalTransformer:
        """The canonical form; built afresh on each use where `forms` holds it (read it once per stage)."""
        return self.held_canonical if self.held_canonical is not None else self.forms.canonical()

    @property
    def width(self) -> int:
        return self.held_canonical.width if self.held_canonical is not None else self.forms.width

    @property
    def built_on_use(self) -> bool:
        """Whether each use of the canonical form gets a copy of its own (a caller may change it in place)."""
        return self.held_canonical is None

    @property
    def label(self) -> str:
        """How results, file names and the report name the endpoint: its seed, or its folder's name."""
        return str(self.seed) if self.name is None else self.name
