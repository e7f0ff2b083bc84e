"""Factored canonical model -> Hugging Face model folder (the inverse of the converters).

Every LayerNorm becomes the identity (the converters folded the norms into the readers), which is exact
while the residual stream stays mean-zero. Attention scaling is divided back out of q, and a head
without a bias gets head.b through the final LayerNorm's bias beta with head.w @ beta = head.b.
"""

from __future__ import annotations

import copy
import inspect
import json
from pathlib import Path

import torch
from torch import Tensor

from glmc.models.canonical import CanonicalTransformer, canonical_activation
from glmc.models.families.base import layer_sizes, residual_axis
from glmc.models.families.registry import family_named, family_of_hf

EXPORT_FILE = "glmc_export.json"


def uncentred_writer(model: CanonicalTransformer, tol: float = 1e-6) -> str | None:
    """The first residual writer whose mean over the width exceeds tol times its largest entry, or None."""
    layout = family_named(model.config.family).layout(model.config)
    for name, t in model.params().items():
        axis = residual_axis(layout, name, "out")
        if axis is None:
            continue
        t = t.detach().double()
        scale = t.abs().max().item()
        if scale > 0 and t.mean(axis).abs().max().item() > tol * scale:
            return name
    return None


def _check_mean_zero(model: CanonicalTransformer) -> None:
    name = uncentred_writer(model)
    if name is not None:
        raise ValueError(
            f"{name} has a non-zero mean over the residual width: the alignment's residual map moved the "
            "stream out of the mean-zero hyperplane (unrestricted orthogonal residual maps do), and a Hugging "
            "Face LayerNorm, which subtracts the mean, cannot reproduce the canonical RMS norm; to export, "
            "align with matcher.<method>.keep_mean=auto (weight matching), or residual=permutation or none"
        )


def check_model(model: CanonicalTransformer, family: str) -> dict[str, Tensor]:
    if not isinstance(model, CanonicalTransformer):
        raise TypeError(f"export_hf takes a canonical model, got {type(model).__name__}")
    if model.config.form != "factored":
        raise ValueError(
            "export_hf needs a factored canonical model: circuit-form attention (QK, OV of size D+1) has no "
            "Hugging Face shape"
        )
    if model.config.family != family:
        raise ValueError(f"a {model.config.family} canonical model cannot be written into a {family} template")
    if model.config.norm_dim != model.width:
        raise ValueError(
            f"the model was widened (width {model.width}, norm_dim {model.config.norm_dim}): a Hugging Face "
            "LayerNorm normalises over the full width, so only models with norm_dim == width export"
        )
    # post-norm families keep their LayerNorms and RMSNorm subtracts no mean: no mean to hold
    if family_named(family).norm == "pre" and family_named(family).mean_zero_stream:
        _check_mean_zero(model)
    return {k: v.detach() for k, v in model.params().items()}


def check_template(model: CanonicalTransformer, activation: str, width_key: str, width: int, heads=None) -> None:
    """ValueError where the template's activation, width (its config key `width_key`) or, given `heads`
    (layers, heads, head dim), its heads are not the model's."""
    if canonical_activation(activation) != model.config.activation:
        raise ValueError(f"the template's activation {activation!r} is not the model's {model.config.activation!r}")
    if model.width != width:
        raise ValueError(f"model width {model.width} but the template's {width_key} is {width}")
    if heads is not None:
        check_heads(model, *heads)


def check_heads(model: CanonicalTransformer, layers: int, heads: int, head_dim: int) -> None:
    """ValueError unless every layer has the template's heads and head dimension (queries, keys, values)."""
    if model.num_layers != layers:
        raise ValueError(f"the model has {model.num_layers} layers, the template {layers}")
    layout = family_named(model.config.family).layout(model.config)
    sizes = layer_sizes(layout, model.params(), layers)
    for layer in range(layers):
        for pair in ("qk", "vo"):
            shape = (sizes["heads"][layer], sizes[pair][layer])
            if shape != (heads, head_dim):
                raise ValueError(
                    f"layer {layer}'s {pair} heads have (heads, head dim) {shape} but the template has "
                    f"{(heads, head_dim)}: heads stacked by a circuit merge (head rank up to 2 * d_head) or widened "
                    "have no Hugging Face shape"
                )


def set_param(module_param: Tensor, value: Tensor, name: str) -> None:
    if tuple(module_param.shape) != tuple(value.shape):
        shapes = f"canonical shape {tuple(value.shape)} but the template has {tuple(module_param.shape)}"
        raise ValueError(f"{name}: {shapes}")
    module_param.copy_(value.to(module_param.dtype))


def set_linear(
    linear: torch.nn.Linear, weight: Tensor, bias: Tensor, name: str, setting: str = "attention_bias / mlp_bias"
) -> None:
    """Weight and bias into a Linear; one without a bias takes a zero one only (`setting` gives it one)."""
    set_param(linear.weight, weight, name + "_w")
    if linear.bias is not None:
        set_param(linear.bias, bias, name + "_b")
    elif bias.abs().max() > 1e-6 * weight.abs().max():
        raise ValueError(f"{name}_b is not zero but the template's layer has no bias: set {setting} in its config")


def set_modules(p, modules: dict[str, torch.nn.Module]) -> None:
    """Each module's weight and bias from p(stem + "w") and p(stem + "b"), by stem ("blocks.0.in_", "head.")."""
    for stem, module in modules.items():
        set_param(module.weight, p(stem + "w"), stem + "w")
        set_param(module.bias, p(stem + "b"), stem + "b")


def set_qkv(p, pre: str, linears) -> None:
    """q, k and v ((Linear, attention scale) each) with their heads flattened and the scale divided out."""
    for name, (lin, scale) in zip("qkv", linears):
        set_param(lin.weight, p(pre + name + "_w").flatten(0, 1) / scale, pre + name + "_w")
        set_param(lin.bias, p(pre + name + "_b").flatten() / scale, pre + name + "_b")


def identity_norm(norm: torch.nn.LayerNorm) -> None:
    norm.weight.fill_(1.0)
    norm.bias.zero_()


def fresh(template: torch.nn.Module, **overrides):
    config = copy.deepcopy(template.config)
    for key, value in overrides.items():
        setattr(config, key, value)
    dtype = next(template.parameters()).dtype
    return type(template)(config).to(dtype).eval()


def head_bias_offset(head_w: Tensor, head_b: Tensor, family: str, tol: float = 1e-6) -> Tensor:
    """beta with head_w @ beta = head_b (least squares, float64), the final norm's bias that carries the head's
    bias in a `family` whose output head has none; ValueError when the residual exceeds tol."""
    w, b = head_w.double(), head_b.double()
    beta = torch.linalg.lstsq(w, b[:, None], driver="gelsd").solution[:, 0]
    scale = b.norm().item()
    residual = (w @ beta - b).norm().item()
    if scale > 0 and residual > tol * scale:
        raise ValueError(
            f"head.b is not in the column space of head.w (relative residual {residual / scale:.2e}): a {family} "
            f"model's output head has no bias, and with vocabulary {w.shape[0]} > width {w.shape[1]} its final "
            f"norm's bias cannot carry this one, so the model has no {family} equivalent: use it in canonical "
            "form (glmc evaluates it as it is); merge.export=false skips the export"
        )
    return beta


@torch.no_grad()
def to_hf(model: CanonicalTransformer, template: torch.nn.Module) -> torch.nn.Module:
    """The Hugging Face model (of the template's class and config) computing what `model` computes."""
    try:
        family = family_of_hf(template)
    except TypeError as err:
        raise TypeError(f"no exporter for a {type(template).__name__} template: {err}") from None
    return family.to_hf(model, template)


def export_hf(
    model: CanonicalTransformer,
    template: torch.nn.Module,
    folder: str | Path,
    dtype: torch.dtype | None = None,
    max_shard_size: str | int = "2GB",
) -> Path:
    """Write a factored canonical model as a Hugging Face model folder beside a glmc_export.json holding
    its canonical config; `template`: an HF model of the same architecture; `dtype`: the weights' dtype
    in the folder (else the template's); `max_shard_size`: save_pretrained's. ValueError for models with no
    exact HF equivalent."""
    hf = to_hf(model, template)
    if dtype is not None:
        hf = hf.to(dtype)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    options = {}
    if "safe_serialization" in inspect.signature(hf.save_pretrained).parameters:  # transformers < 5
        options["safe_serialization"] = True
    hf.save_pretrained(folder, max_shard_size=max_shard_size, **options)
    info = {
        "architecture": type(hf).__name__,
        "dtype": str(next(hf.parameters()).dtype).removeprefix("torch."),
        "canonical_config": model.config.to_dict(),
    }
    (folder / EXPORT_FILE).write_text(json.dumps(info, indent=2) + "\n")
    return folder
