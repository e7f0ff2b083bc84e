"""Endpoints from your own Hugging Face model folders: `endpoints=pretrained endpoints.paths=[a,b,...]`.

A folder is what `save_pretrained` writes: config.json and safetensors weights (model.safetensors, or
the shards that model.safetensors.index.json lists) and, for text, the tokenizer (tokenizer.json). Its
family comes from config.json's `model_type` through the family registry (glmc.models.families), so a
family added there is read here without a change. Its class is the first of config.json's
`architectures` that the family converts, or else the family's first class for the data task. Nothing
in a folder runs: a config or tokenizer that asks for code of its own (`auto_map`) is refused,
weights are read from safetensors only, and transformers never gets `trust_remote_code`.

A folder stored in bfloat16 or float16 (`Folder.dtype`, from the safetensors headers) loads in float32,
which holds its values exactly: conversion, matching and evaluation run in float32, and an exported
midpoint is written back in the folder's dtype (glmc.pipeline.merges.export_midpoint).

This module reads a folder (`read_folder`: config.json and the safetensors headers only; `saved_vocabulary`:
its tokenizer's JSON files) and loads its model (`load_model`; glmc.pipeline.endpoints makes endpoints of
them): every weight of the class must be in the files and finite, and the family must convert the model;
where some models' heads are tied to their embeddings and others' not, the tied ones are untied
(`untie_mixed_heads`). Whether the folders fit the data and each other is glmc.pipeline.folder_fit's.
Every message names the folder (`endpoints.paths[i]`).

The endpoints are never trained and never cached: pairs are formed over the folders in order, as over
seeds, and each endpoint is labelled with its folder's name in results.json and the report.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from omegaconf import open_dict

from glmc.config import Config
from glmc.data.tokenizer_folder import error_reason
from glmc.datasets import dataset

if TYPE_CHECKING:
    from glmc.models.families.base import Family

log = logging.getLogger(__name__)

CONFIG, WEIGHTS, INDEX = "config.json", "model.safetensors", "model.safetensors.index.json"
PICKLES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack")
SAVE_AGAIN = "save the model there again with save_pretrained"
# the data task of a Hugging Face class, by the suffix the library gives its classes
CLASS_TASKS = (
    ("ForMaskedLM", "masked_lm"),
    ("ForCausalLM", "causal_lm"),
    ("LMHeadModel", "causal_lm"),
    ("ForSequenceClassification", "classification"),
    ("ForImageClassification", "classification"),
)


class FolderError(ValueError):
    """A model folder that cannot be used; the message names it (endpoints.paths[i]=...) and the problem."""


def is_pretrained(cfg: Config) -> bool:
    return str(cfg.endpoints.source) == "pretrained"


def task_of_class(name: str) -> str | None:
    return next((task for suffix, task in CLASS_TASKS if name.endswith(suffix)), None)


def folder_names(paths: list[str]) -> list[str]:
    """A label per folder for results and file names: its name, with characters other than letters,
    digits and . _ + - replaced; names that repeat get their index in front."""
    names = []
    for i, path in enumerate(paths):
        base = Path(path).expanduser().resolve().name
        names.append(re.sub(r"[^A-Za-z0-9._+-]+", "_", base).strip("._") or f"model{i}")
    return [f"{i}_{n}" if names.count(n) > 1 else n for i, n in enumerate(names)]


@dataclass(frozen=True)
class Folder:
    """One checkpoint folder as read from its config.json and its weights' headers."""

    index: int
    path: Path
    name: str
    family: Family
    hf_class: str  # the transformers class it is loaded with
    hf_config: Any  # the transformers config (AutoConfig)
    weights: tuple[Path, ...]  # its safetensors files
    dtype: str = "float32"  # what its weights are stored in (stored_dtype); they are loaded in float32

    @property
    def key(self) -> str:
        return f"endpoints.paths[{self.index}]={self.path}"

    @property
    def task(self) -> str | None:
        return task_of_class(self.hf_class)

    def limits(self) -> dict[str, Any]:
        """Positions, vocabulary and classes as the family reads them from the config."""
        return self.family.hf_input_limits(self.hf_config)

    def size(self, name: str) -> Any:
        """A size every transformers config names alike (hidden_size, num_hidden_layers, ...), or None."""
        return getattr(self.hf_config, name, None)


def _read_json(file: Path, key: str) -> Any:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise FolderError(
            f"{key}: {file.name} is not valid JSON ({error_reason(err, 300)}): the file is damaged; {SAVE_AGAIN}"
        ) from None


def _weight_files(path: Path, key: str) -> tuple[Path, ...]:
    """The folder's safetensors files, each with a header that parses and data that cover it."""
    from safetensors import SafetensorError, safe_open

    if (path / WEIGHTS).is_file():
        files = [path / WEIGHTS]
    elif (path / INDEX).is_file():
        index = _read_json(path / INDEX, key)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise FolderError(f"{key}: {INDEX} lists no weights (no weight_map); {SAVE_AGAIN}")
        files = [path / name for name in sorted(set(map(str, weight_map.values())))]
        outside = [f.name for f in files if f.resolve().parent != path.resolve() or not f.name.endswith(".safetensors")]
        if outside:
            raise FolderError(f"{key}: {INDEX} lists {outside[0]}, not a safetensors file of the folder; {SAVE_AGAIN}")
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise FolderError(f"{key}: {INDEX} lists {missing[0]}, which the folder does not hold; copy it whole")
    else:
        pickles = [name for name in PICKLES if (path / name).is_file()]
        if pickles:
            raise FolderError(
                f"{key}: holds {pickles[0]} but no {WEIGHTS}: glmc reads safetensors weights only (a pickle can run "
                "code); load the model once where you trust it and save it with save_pretrained, which writes "
                "safetensors"
            )
        present = sorted(p.name for p in path.iterdir())
        raise FolderError(f"{key}: holds no weights ({WEIGHTS}); it holds {present}; {SAVE_AGAIN}")
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as f:
                f.keys()
        except (SafetensorError, OSError, ValueError) as err:
            raise FolderError(
                f"{key}: {file.name} is damaged ({error_reason(err, 300)}): a copy cut short or overwritten; "
                f"copy it again or {SAVE_AGAIN}"
            ) from None
    return tuple(files)


def _hf_class(family: Family, config: dict[str, Any], task: str, key: str) -> str:
    listed = config.get("architectures") or []
    if not isinstance(listed, list):
        listed = [listed]
    if listed:
        known = [str(a) for a in listed if a in family.hf_classes]
        if not known:
            raise FolderError(
                f"{key}: its config.json's architectures {listed} are none of the classes the {family.name} family "
                f"converts ({', '.join(family.hf_classes)}); save the model as one of them"
            )
        return known[0]
    fits = [c for c in family.hf_classes if task_of_class(c) == task]
    if not fits:
        raise FolderError(
            f"{key}: config.json names no architectures and the {family.name} family has no class for "
            f"data.task={task} ({', '.join(family.hf_classes)})"
        )
    return fits[0]


def read_folder(path: str, index: int, task: str, name: str | None = None) -> Folder:
    """The folder `endpoints.paths[index]` as far as config.json and the weights' headers tell;
    FolderError naming it for anything that would fail later."""
    from transformers import AutoConfig

    from glmc.models.families import family_of_model_type
    from glmc.models.families.llama import ROTARY_TYPES, unread_rope_type
    from glmc.pipeline.folder_shapes import shape_problem

    key = f"endpoints.paths[{index}]={path}"
    folder = Path(path).expanduser()
    if not folder.exists():
        raise FolderError(f"{key}: no such folder; give the folder that save_pretrained wrote")
    if not folder.is_dir():
        raise FolderError(f"{key}: not a folder; give the folder that save_pretrained wrote (it holds {CONFIG})")
    if not (folder / CONFIG).is_file():
        present = sorted(p.name for p in folder.iterdir())
        raise FolderError(f"{key}: holds no {CONFIG} (it holds {present or 'nothing'}); {SAVE_AGAIN}")
    config = _read_json(folder / CONFIG, key)
    if not isinstance(config, dict):
        raise FolderError(f"{key}: {CONFIG} holds {type(config).__name__}, not a model config; {SAVE_AGAIN}")
    if config.get("auto_map") or config.get("trust_remote_code"):
        asked = "auto_map" if config.get("auto_map") else "trust_remote_code"
        raise FolderError(
            f"{key}: {CONFIG} asks for the folder's own code ({asked}), and glmc never runs code from a model "
            "folder; save the model with a class of the transformers library"
        )
    model_type = config.get("model_type")
    if not model_type:
        raise FolderError(f"{key}: {CONFIG} names no model_type; {SAVE_AGAIN}")
    try:
        family = family_of_model_type(model_type)
    except ValueError as err:
        raise FolderError(f"{key}: {err}") from None
    unread = unread_rope_type(config)
    if unread:
        raise FolderError(
            f"{key}: its {CONFIG} names the rotary type {unread[0]}={unread[1]!r}, which glmc does not read; it "
            f"reads {', '.join(ROTARY_TYPES)}: give a model saved with one of them"
        )
    hf_class = _hf_class(family, config, task, key)
    try:
        hf_config = AutoConfig.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
    except Exception as err:  # the library's own errors: say which folder and why
        unusable = family.hf_config_problems(SimpleNamespace(**config))  # its validation names no fix
        if unusable:
            raise FolderError(f"{key}: " + "; and ".join(unusable)) from None
        raise FolderError(
            f"{key}: {CONFIG} does not load as a {model_type} config ({error_reason(err, 300)}); {SAVE_AGAIN}"
        ) from None
    unusable = family.hf_config_problems(hf_config)
    if unusable:
        raise FolderError(f"{key}: " + "; and ".join(unusable))
    weights = _weight_files(folder, key)
    mismatch = shape_problem(hf_class, hf_config, config, weights)  # headers only: nothing built yet
    if mismatch:
        raise FolderError(f"{key}: {mismatch}")
    dtype = stored_dtype(weights, config)
    return Folder(index, folder, name or folder.name, family, hf_class, hf_config, weights, dtype)


# safetensors' names of the floating-point dtypes a folder may be stored in, as torch names them
SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def stored_dtype(files: tuple[Path, ...], config: dict[str, Any]) -> str:
    """The dtype the folder's weights are stored in, from the safetensors headers (what is stored, whatever
    config.json's dtype or torch_dtype says): the floating-point dtype holding most of the values, or
    config.json's where no tensor is floating-point."""
    from safetensors import safe_open

    counts: dict[str, int] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                part = handle.get_slice(name)
                kind = part.get_dtype()
                if kind.startswith(("F", "BF")):  # not the integer buffers some models store
                    counts[kind] = counts.get(kind, 0) + math.prod(part.get_shape())
    if counts:
        kind = max(counts, key=counts.get)
        return SAFETENSORS_DTYPES.get(kind, kind.lower())
    declared = config.get("dtype") or config.get("torch_dtype")
    return declared if isinstance(declared, str) and declared != "auto" else "float32"


def evaluation_config(cfg: Config) -> Config:
    """The run config with the data as an endpoints=pretrained run reads them: text encoded with the
    saved tokenizer of data.tokenizer_path, else of the first folder (data.tokenizer=pretrained).
    Unchanged for trained endpoints and for images."""
    if not is_pretrained(cfg) or not dataset(cfg.data.name).is_text:
        return cfg
    own = copy.deepcopy(cfg)
    with open_dict(own):
        own.data.tokenizer = "pretrained"
        if not own.data.tokenizer_path and cfg.endpoints.paths:
            own.data.tokenizer_path = str(Path(str(cfg.endpoints.paths[0])).expanduser())
    return own


# the special tokens a tokenizer_config.json or special_tokens_map.json names, by role
TOKEN_ROLES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def _token(value: Any) -> str | None:
    """A special token as the JSON files write it: the token itself, or {"content": token, ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _model_vocab(folder: Path, key: str) -> dict[str, int] | None:
    """token -> id of the tokenizer's model: tokenizer.json (a fast tokenizer), else vocab.json (GPT-2's slow
    one) or vocab.txt (BERT's, one token a line); None when the folder holds none of them."""
    if (folder / "tokenizer.json").is_file():
        model = _read_json(folder / "tokenizer.json", key)
        vocab = model.get("model", {}).get("vocab") if isinstance(model, dict) else None
        if isinstance(vocab, list):  # Unigram: [piece, score] in id order
            vocab = {str(entry[0]): i for i, entry in enumerate(vocab) if isinstance(entry, list) and entry}
        vocab = dict(vocab) if isinstance(vocab, dict) else {}
        added = model.get("added_tokens") if isinstance(model, dict) else None
        for entry in added if isinstance(added, list) else []:
            if isinstance(entry, dict) and isinstance(entry.get("content"), str):
                vocab[entry["content"]] = entry.get("id")
        return vocab
    if (folder / "vocab.json").is_file():
        vocab = _read_json(folder / "vocab.json", key)
        return dict(vocab) if isinstance(vocab, dict) else {}
    if (folder / "vocab.txt").is_file():
        lines = (folder / "vocab.txt").read_text(encoding="utf-8", errors="replace").splitlines()
        return {token: i for i, token in enumerate(lines)}
    return None


def tokenizer_asks_for_code(folder: Path, key: str) -> bool:
    """Whether the folder's tokenizer_config.json asks for code of its own (auto_map), which is never run."""
    file = folder / "tokenizer_config.json"
    content = _read_json(file, key) if file.is_file() else None
    return isinstance(content, dict) and bool(content.get("auto_map"))


def saved_vocabulary(folder: Path, key: str) -> tuple[dict[str, int], dict[str, str | None]] | None:
    """(token -> id, special token role -> token) of the tokenizer save_pretrained wrote in `folder`, read
    from its JSON files only (nothing runs); None when the folder holds no tokenizer."""
    vocab = _model_vocab(folder, key)
    if vocab is None:
        return None
    special: dict[str, str | None] = {}
    for name in ("added_tokens.json", "tokenizer_config.json", "special_tokens_map.json"):  # later ones win
        content = _read_json(folder / name, key) if (folder / name).is_file() else {}
        if not isinstance(content, dict):
            continue
        if name == "added_tokens.json":
            vocab.update({str(t): i for t, i in content.items()})
            continue
        decoder = content.get("added_tokens_decoder")
        for i, entry in decoder.items() if isinstance(decoder, dict) else ():
            if _token(entry) is not None and str(i).isdigit():
                vocab[_token(entry)] = int(i)
        special.update({role: _token(content[role]) for role in TOKEN_ROLES if role in content})
    return vocab, special


def load_model(f: Folder):
    """The folder's model in float32 (a bfloat16 or float16 folder is converted exactly: the alignment, its
    checks and the evaluation run in float32), eval mode, from its safetensors files and local files only."""
    import torch
    import transformers
    from transformers.utils import logging as hf_logging

    cls = getattr(transformers, f.hf_class)
    log.info("%s: loading its %s weights", f.key, f.hf_class)  # a large model takes a while to read
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model, info = cls.from_pretrained(
            str(f.path),
            config=f.hf_config,
            local_files_only=True,
            use_safetensors=True,
            dtype=torch.float32,
            output_loading_info=True,
        )
    except Exception as err:  # the library's own errors (a tensor of the wrong shape, a damaged file)
        raise FolderError(f"{f.key}: does not load as {f.hf_class} ({error_reason(err, 300)}); {SAVE_AGAIN}") from err
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise FolderError(
            f"{f.key}: its weights lack {shown} of {f.hf_class}, which would start at random values; save the "
            f"whole {f.hf_class} there with save_pretrained"
        )
    _check_finite(f, model)
    return model.eval()


def _check_finite(f: Folder, model) -> None:
    """FolderError naming the folder, the tensor and its file when a weight is NaN or infinite: such a
    model has no barrier, and the matchers would fail deep inside (a LinAlgError) or give null barriers."""
    from safetensors import safe_open

    from glmc.models.convert import nonfinite_weight

    found = nonfinite_weight(model)
    if found is None:
        return
    tensor, bad, total = found
    files = []
    for file in f.weights:  # headers only: which file holds the tensor
        with safe_open(str(file), framework="pt") as handle:
            files += [file.name] if tensor in handle.keys() else []
    where = f" (in {files[0]})" if files else ""
    raise FolderError(
        f"{f.key}: its weight {tensor}{where} holds {bad} NaN or infinite value(s) of {total}: the checkpoint "
        "is damaged or was saved after its training diverged; save a model with finite weights there, or leave "
        "the folder out of endpoints.paths"
    )


def head_is_tied(model) -> bool:
    """Whether the model's output head is its token embedding (one tensor, tie_word_embeddings)."""
    head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    return head is not None and embedding is not None and head.weight is embedding.weight


def untie_mixed_heads(folders: list[Folder], models: list) -> list:
    """`models`, where some have a head tied to their embedding and others not, with the tied heads made
    tensors of their own holding the embedding's values: a tied model is an untied one whose head equals
    its embedding, so its function is kept, and the models then share their parameters' names (the
    original models are interpolated parameter by parameter). Unchanged where the models agree."""

    tied = [head_is_tied(m) for m in models]
    if all(tied) or not any(tied):
        return models
    for f, model, is_tied in zip(folders, models, tied):
        if is_tied:
            untie_head(f, model)
    return models


def untie_head(f: Folder, model):
    """The model with its tied output head made a tensor of its own holding the embedding's values."""
    untie_output_head(model)
    log.info("%s: its output head is tied to its embedding; untied to pair it with untied models", f.key)
    return model


def untie_output_head(model) -> None:
    """Give a model's tied output head a tensor of its own holding the embedding's values (its function kept)."""
    import torch

    head = model.get_output_embeddings()
    head.weight = torch.nn.Parameter(model.get_input_embeddings().weight.detach().clone())
    model.config.tie_word_embeddings = False  # kept apart where the library would tie them again


def float32_bytes(f: Folder) -> int:
    """The folder's weights in float32 bytes (what its model holds once loaded), from the files' headers."""
    from safetensors import safe_open

    total = 0
    for file in f.weights:
        with safe_open(str(file), framework="pt") as weights:
            for name in weights.keys():
                shape = weights.get_slice(name).get_shape()
                total += 4 * int(math.prod(shape))
    return total


def canonical_of(f: Folder, model, keep_source: bool = True):
    """The folder's model in canonical form; FolderError naming the folder where its family cannot convert it.
    A large model's conversion temporaries are handed back to the system (glmc.host_memory). `keep_source`:
    whether the canonical model keeps `model` as its source (False: the model can be freed)."""
    from glmc.host_memory import release_after
    from glmc.models.convert import to_canonical

    try:
        converted = to_canonical(model)
    except (NotImplementedError, ValueError, TypeError) as err:
        raise FolderError(f"{f.key}: the {f.family.name} family cannot convert this {f.hf_class} ({err})") from err
    if not keep_source:
        converted.with_source(None)
    release_after(converted.params().values())
    return converted


def mixed_dtypes_warning(cfg: Config, folders: list[Folder]) -> str | None:
    """What a run of folders stored in different dtypes does, naming each folder and its dtype; None when
    they share one. Every model is loaded, aligned and evaluated in float32, which holds bfloat16 and
    float16 values exactly, so the barrier is that of the stored models; an exported midpoint takes the
    dtype of its pair's first folder (A), whose model it is written as."""
    if len({f.dtype for f in folders}) < 2:
        return None
    listed = ", ".join(f"{f.key} in {f.dtype}" for f in folders)
    export = ""
    if cfg.merge.export:
        export = (
            "; merge.export writes the merged midpoint in the dtype of its pair's first folder (A), so a "
            "float32 model merged into a half-precision A is rounded to A's dtype"
        )
    aligned = "every model is aligned and evaluated in float32"
    return f"the folders are stored in different dtypes ({listed}): {aligned}{export}"
