"""The RoBERTa family: RobertaForMaskedLM / RobertaForSequenceClassification through BERT's canonical layout.

It differs in module names, its masked-LM activation (GELU) and positions, which count the non-padding
tokens from pad_token_id + 1 on: embed.pos keeps the table from row pad_token_id on.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from transformers import RobertaConfig, RobertaForMaskedLM, RobertaForSequenceClassification

from glmc.models.canonical import CanonicalConfig
from glmc.models.export import set_param
from glmc.models.families.bert import BertFamily


class RobertaFamily(BertFamily):
    name = "roberta"
    model_types = ("roberta",)
    hf_classes = ("RobertaForMaskedLM", "RobertaForSequenceClassification")

    def base(self, hf: nn.Module) -> nn.Module:
        return hf.roberta

    def mlm_modules(self, hf: nn.Module) -> tuple[nn.Linear, nn.LayerNorm, nn.Linear]:
        return hf.lm_head.dense, hf.lm_head.layer_norm, hf.lm_head.decoder

    def classifier_modules(self, hf: nn.Module) -> tuple[nn.Linear, nn.Linear]:
        return hf.classifier.dense, hf.classifier.out_proj

    def mlm_activation(self, config: CanonicalConfig) -> str:
        return "gelu"

    def position_table(self, hf: nn.Module) -> Tensor:
        return self.base(hf).embeddings.position_embeddings.weight[hf.config.pad_token_id :]

    def write_positions(self, hf: nn.Module, pos: Tensor) -> None:
        table = self.base(hf).embeddings.position_embeddings.weight
        table.zero_()  # the rows below the padding row are never read
        set_param(table[hf.config.pad_token_id :], pos, "embed.pos")

    def positions(self, config: CanonicalConfig, inputs: Tensor) -> Tensor:
        real = (inputs != config.pad_token_id).long()
        return torch.cumsum(real, 1) * real

    def pad_token_id(self, hf_config: Any) -> int | None:
        return hf_config.pad_token_id

    def hf_class(self, head: str) -> type:
        return RobertaForMaskedLM if head == "mlm" else RobertaForSequenceClassification

    def hf_config(self, cfg: Any, **common) -> Any:
        # padding id 0 (the project's tokenizers put [PAD] there): positions 1 .. max_positions
        return RobertaConfig(**common, max_position_embeddings=cfg.max_positions + 1, pad_token_id=0)

    def input_limits(self, params) -> dict[str, Any]:
        return {**super().input_limits(params), "positions": params["embed.pos"].shape[0] - 1}

    def hf_input_limits(self, hf_config) -> dict[str, Any]:
        positions = hf_config.max_position_embeddings - hf_config.pad_token_id - 1
        return {"positions": positions, "vocab": hf_config.vocab_size}


FAMILY = RobertaFamily()
