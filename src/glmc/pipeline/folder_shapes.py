"""A model folder's config.json against its safetensors headers, before any model is built or loaded.

A config.json that does not describe its weights (a layer count or a size edited, or copied from another
model) would otherwise be found only once transformers builds the model it describes, which for a size of
millions allocates gigabytes first. The headers (the JSON at the start of each file, no tensor) give every
tensor's name and shape; the layers they hold are counted from the names, and the shapes the config implies
come from the class built on the meta device (no memory), once the layer count agrees.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

# the first integer part of a tensor's name is its layer (model.layers.3., transformer.h.3., encoder.layer.3.)
_LAYER = re.compile(r"\.(\d+)\.")


def header_shapes(files: tuple[Path, ...]) -> dict[str, tuple[tuple[int, ...], str]]:
    """tensor name -> (its shape, the file holding it), from the safetensors headers only."""
    from safetensors import safe_open

    shapes = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                shapes[name] = (tuple(handle.get_slice(name).get_shape()), file.name)
    return shapes


def _file_layers(shapes: dict[str, tuple[tuple[int, ...], str]]) -> tuple[int, str] | None:
    """(the layers the tensors' names number, a tensor of the last one), or None where no name has a layer."""
    found = [(int(m.group(1)), name) for name in shapes if (m := _LAYER.search(name))]
    return max(found) if found else None


def _keys_of(config: dict[str, Any], value: int) -> list[str]:
    """config.json's top-level keys holding `value`: the sizes a mismatched dimension comes from."""
    return [k for k, v in config.items() if isinstance(v, int) and not isinstance(v, bool) and v == value]


def _expected_shapes(hf_class: str, hf_config: Any) -> tuple[dict[str, tuple[int, ...]], str, int]:
    """(tensor name -> shape of the model `hf_config` describes, its base model prefix, its count of weights),
    from the class built on the meta device: no memory is allocated, whatever the sizes."""
    import torch
    import transformers

    cls = getattr(transformers, hf_class)
    with torch.device("meta"):
        model = cls(hf_config)
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    total = sum(p.numel() for p in model.parameters())  # a tied head counted once, as it is saved
    return shapes, str(getattr(model, "base_model_prefix", "") or ""), total


def _layer_problem(config: dict[str, Any], hf_config: Any, found: tuple[int, str] | None, files) -> str | None:
    layers = getattr(hf_config, "num_hidden_layers", None)
    if found is None or not isinstance(layers, int) or layers == found[0] + 1:
        return None
    named = [k for k in ("num_hidden_layers", "n_layer", "num_layers") if config.get(k) == layers]
    key = named[0] if named else "num_hidden_layers"
    last, file = found[1], files[found[1]][1]
    return (
        f"its config.json's {key}={layers}, but its weights hold {found[0] + 1} layers (the last tensor of the last "
        f"layer: {last} in {file}): the config does not describe these weights; set {key}={found[0] + 1} or save "
        "the model there again with save_pretrained"
    )


AGAIN = (
    "the config does not describe these weights; set the config's sizes to the weights' or save the model there "
    "again with save_pretrained"
)


def _named_problem(config, shapes, expected, prefix) -> str | None:
    """A tensor the files and the class both name, of another shape in the files."""
    for name, (shape, file) in shapes.items():
        own = name if name in expected else f"{prefix}.{name}"
        if own not in expected or expected[own] == shape:
            continue
        want = expected[own]
        dims = [w for w, s in zip(want, shape) if w != s] if len(want) == len(shape) else []
        keys = [f"{k}={w}" for w in dims for k in _keys_of(config, w)]
        named = f"its config.json's {', '.join(dict.fromkeys(keys))}" if keys else "its config.json"
        return f"{named} makes {name} of shape {list(want)}, but {file} holds it as {list(shape)}: {AGAIN}"
    return None


def _count_problem(config, shapes, expected, total) -> str | None:
    """More weights described than the files hold, where a size of the config is no dimension of any tensor
    there (tensors the files store in another layout, which transformers converts, name no shared tensor)."""
    held = sum(math.prod(shape) for shape, _ in shapes.values())
    if total <= held:
        return None
    stored = {d for shape, _ in shapes.values() for d in shape}
    for name, want in expected.items():
        keys = [f"{k}={d}" for d in want if d > 1 and d not in stored for k in _keys_of(config, d)]
        if keys:
            return (
                f"its config.json's {', '.join(dict.fromkeys(keys))} makes {name} of shape {list(want)}, and a model "
                f"of {total} weights, but the folder's files hold {held} and no tensor with such a dimension: {AGAIN}"
            )
    return None


def shape_problem(hf_class: str, hf_config: Any, config: dict[str, Any], files: tuple[Path, ...]) -> str | None:
    """Why the folder's config.json does not describe the tensors in its safetensors `files` (naming the key,
    the tensor and both shapes), or None. Tensors the class does not name (a tied head left out, an older
    layout transformers converts) are left to the load."""
    shapes = header_shapes(files)
    problem = _layer_problem(config, hf_config, _file_layers(shapes), shapes)
    if problem:
        return problem
    try:
        expected, prefix, total = _expected_shapes(hf_class, hf_config)
    except Exception:  # a class that cannot be built without memory: the load checks the shapes
        return None
    return _named_problem(config, shapes, expected, prefix) or _count_problem(config, shapes, expected, total)
