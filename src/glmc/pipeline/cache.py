"""Endpoint cache: outputs/endpoints/<hash of model+data+training config>/seed_<n>/.

Each entry is `model.safetensors` (tensors only, so loading never unpickles code) and `meta.json`
(the config that produced it and the endpoint's metrics). An entry is written into a temporary
folder beside its final place and renamed into place only when complete, so a killed run leaves at
most a stray temporary folder, never an entry that a later run would trust.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model, save_model

WEIGHTS, META = "model.safetensors", "meta.json"
# Data settings that change which examples a model sees, or in which order.
DATA_KEYS = ("name", "task", "batch_size", "test_fraction", "split_seed", "augment", "limit_train")


def endpoint_key(model_cfg: dict, data_cfg: dict, train_cfg: dict) -> dict[str, Any]:
    """The part of the config that determines a trained endpoint (besides its seed)."""
    return {"model": model_cfg, "data": {k: data_cfg[k] for k in DATA_KEYS}, "train": train_cfg}


def config_hash(key: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class EndpointCache:
    root: Path

    def entry(self, key: dict[str, Any], seed: int) -> Path:
        return Path(self.root) / config_hash(key) / f"seed_{seed}"

    def has(self, key: dict[str, Any], seed: int) -> bool:
        entry = self.entry(key, seed)
        return (entry / WEIGHTS).is_file() and (entry / META).is_file()

    def load(self, key: dict[str, Any], seed: int, model: torch.nn.Module) -> dict[str, Any]:
        """Fill `model` (already built from the same config) in place; return the stored metadata."""
        entry = self.entry(key, seed)
        meta = json.loads((entry / META).read_text())
        if meta["key"] != json.loads(json.dumps(key)):
            raise RuntimeError(f"{entry} holds a different config than its hash claims; delete the folder")
        load_model(model, str(entry / WEIGHTS), strict=True, device="cpu")
        return meta

    def save(self, key: dict[str, Any], seed: int, model: torch.nn.Module, metrics: dict[str, Any]) -> Path:
        final = self.entry(key, seed)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
        try:
            save_model(model, str(tmp / WEIGHTS))
            meta = {"key": key, "seed": seed, "metrics": metrics}
            (tmp / META).write_text(json.dumps(meta, indent=2, sort_keys=True))
            if final.exists():  # a concurrent run finished the same entry first: keep theirs
                shutil.rmtree(tmp)
            else:
                os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return final
