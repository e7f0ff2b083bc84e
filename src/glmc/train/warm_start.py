"""Fine-tuning from a pretrained checkpoint: a Hugging Face model starts from another's `base_model` (encoder);
its task head and a pooler only it has keep their initialisation."""

from __future__ import annotations

from torch import nn


def load_encoder(model: nn.Module, pretrained: nn.Module) -> nn.Module:
    """Copy `pretrained`'s encoder weights into `model`; ValueError naming a missing or misshapen tensor."""
    target, source = model.base_model, pretrained.base_model
    weights = source.state_dict()
    own = target.state_dict()
    for name, tensor in own.items():
        if name not in weights:
            if name.startswith("pooler."):  # a classification model's pooler: trained by fine-tuning
                continue
            raise ValueError(f"the pretrained encoder has no {name}: it is not the same architecture")
        if weights[name].shape != tensor.shape:
            raise ValueError(
                f"{name}: pretrained shape {tuple(weights[name].shape)}, the model's {tuple(tensor.shape)}"
            )
    extra = sorted(set(weights) - set(own))
    if extra:
        raise ValueError(f"the pretrained encoder has tensors the model lacks: {extra[:5]}")
    target.load_state_dict({k: v for k, v in weights.items()}, strict=False)
    return model
