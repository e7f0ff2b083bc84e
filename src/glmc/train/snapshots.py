"""An endpoint's weights along its training (`train.save_steps`): a snapshot after chosen optimizer steps,
each `step_<k>.safetensors` in a folder beside the endpoint's cache entry (`steps_seed_<n>`), written
beside its place and renamed, so a killed run leaves no half-written snapshot and a rerun trains nothing.

`train.save_steps` is null (no snapshots), an int N (steps 0, N, 2N, ...) or a list of steps; the last
step of training is always saved too, so a series ends at the finished endpoint. Saving reads the weights
and draws no random number: the endpoint is the same, bit for bit, with snapshots or without."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback
from safetensors.torch import load_model, save_model

from glmc.safe_files import atomic_path, atomic_write_text
from glmc.train.storage import no_room_error, state_bytes

TOTAL = "steps.json"  # records the run's total optimizer steps, so the planned steps are known without training


def snapshot_dir(entry_folder: Path, seed: int) -> Path:
    """The snapshots of `seed` beside its cache entry (`entry_folder` is the entry's parent, the config hash)."""
    return Path(entry_folder) / f"steps_seed_{seed}"


def snapshot_file(folder: Path, step: int) -> Path:
    return Path(folder) / f"step_{step}.safetensors"


def planned_steps(save_steps: int | Sequence[int], total: int) -> list[int]:
    """The steps a run of `total` optimizer steps saves: every `save_steps`-th from 0 (an int), or the
    listed ones (each at most `total`); `total` itself always."""
    if isinstance(save_steps, int):
        steps = set(range(0, total + 1, save_steps))
    else:
        late = [s for s in save_steps if s > total]
        if late:
            raise ValueError(
                f"train.save_steps={list(save_steps)}: step {late[0]} is past the end of training ({total} "
                "optimizer steps); list steps up to it, or raise train.max_epochs"
            )
        steps = set(save_steps)
    return sorted(steps | {total})


def recorded_total(folder: Path) -> int | None:
    """The total steps of the training that wrote `folder`, or None where none has begun there."""
    try:
        return int(json.loads((Path(folder) / TOTAL).read_text())["total"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def missing_steps(folder: Path, save_steps: Any) -> list[int] | None:
    """The planned steps without a snapshot in `folder` (None: no training has recorded its length there)."""
    total = recorded_total(folder)
    if total is None:
        return None
    return [s for s in planned_steps(save_steps, total) if not snapshot_file(folder, s).is_file()]


def load_snapshot(model: torch.nn.Module, folder: Path, step: int) -> torch.nn.Module:
    """`model` (built from the endpoint's config) filled with the snapshot of `step`."""
    path = snapshot_file(folder, step)
    try:
        load_model(model, str(path), strict=True, device="cpu")
    except Exception as err:
        raise ValueError(
            f"{path}: the snapshot of step {step} does not load ({err}); delete it and run the same command "
            "again to train it anew"
        ) from err
    return model.eval()


class Snapshots(Callback):
    """Saves the trained module's `model` after each planned optimizer step (rank 0 only); a snapshot
    already on disk, e.g. from before a resumed epoch, is kept."""

    def __init__(self, folder: Path, save_steps: int | Sequence[int]):
        self.folder = Path(folder)
        self.save_steps = save_steps
        self.steps: set[int] = set()

    def on_train_start(self, trainer, pl_module) -> None:
        total = int(trainer.estimated_stepping_batches)
        self.steps = set(planned_steps(self.save_steps, total))
        if trainer.is_global_zero:
            atomic_write_text(self.folder / TOTAL, json.dumps({"total": total}))
        self._save(trainer, pl_module)  # step 0: the initialisation (a resumed run is past it)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._save(trainer, pl_module)

    def _save(self, trainer, pl_module) -> None:
        step = trainer.global_step
        path = snapshot_file(self.folder, step)
        if step not in self.steps or not trainer.is_global_zero or path.exists():
            return
        try:
            with atomic_path(path) as tmp:
                save_model(pl_module.model, str(tmp))
        except Exception as err:  # OSError, or safetensors' own error carrying the system's code
            refusal = no_room_error(err, f"the snapshot {path.name}", self.folder, state_bytes(pl_module.model))
            if refusal is None:
                raise
            raise refusal from err
