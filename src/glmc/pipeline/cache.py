"""Endpoint cache: outputs/endpoints/<hash of model+data+training config>/seed_<n>/.

Each entry is `model.safetensors` (tensors only, so loading never unpickles code) and `meta.json`
(the config that produced it and the endpoint's metrics). An entry is written into a temporary
folder beside its final place and renamed into place only when complete, so a killed run leaves at
most a stray temporary folder, never an entry that a later run would trust; such folders older than
an hour are removed when the cache is opened.

The key (`endpoint_key`) holds every setting of the model, data, train and trainer sections except an
allow-list of those that cannot change the weights, and the checksums of the corpus and tokenizer.
An entry is built under a file lock (`lock`, `<hash>/.seed_<n>.lock`): a second run of the same
entry waits, then loads what the first one cached.

Training in progress checkpoints into `<hash>/.train_seed_<n>/last.ckpt` (`training_dir`), which a
rerun of the same config resumes from and which is removed once the entry is cached.

Files and folders of the cache take the user's file mode (0o666 / 0o777 less the umask), as any file
the user creates would. A disk without room for an entry is a refusal that names the folder and the
size needed (glmc.train.storage); the temporary folder is removed.

meta.json records the sha256 of model.safetensors, the seed and the key. An entry whose meta.json
records no checksum (nothing could vouch for its weights), another seed or another key, whose checksum
does not match, whose files are truncated, missing or unreadable, or whose weights are not finite is
moved aside to `seed_<n>.corrupt-<timestamp>` with a warning, and `load` raises `CorruptEntryError`,
so the caller trains the endpoint again instead of using it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock, Timeout
from safetensors import SafetensorError
from safetensors.torch import load_model, save_model

from glmc.safe_files import current_umask, move_aside
from glmc.train.storage import no_room_error, state_bytes

log = logging.getLogger(__name__)

WEIGHTS, META = "model.safetensors", "meta.json"
STALE_TMP_SECONDS = 3600  # a temporary folder this old belongs to no live writer
KEY_VERSION = 2  # bumped when the key's layout changes, so that older entries are never mistaken for new ones

# The key holds every field of the model, data, train and trainer sections except these, which cannot
# change the trained weights: an allow-list, so that a setting added later is part of the key until
# someone shows it does not matter. Where the data comes from enters through its checksums instead
# of data.root and data.path (glmc.data.fingerprint).
NOT_WEIGHTS = {
    "data": ("root", "download", "eval_batch_size", "limit_test", "tokenizer_path", "path"),
    # flush_denormals enters as what it does where it applies (glmc.pipeline.endpoints.cache_key)
    "trainer": ("_target_", "enable_progress_bar", "log_every_n_steps", "flush_denormals"),
    # how many endpoints train at once, each as it would alone (ensemble: within round-off); snapshots saved
    # beside the endpoint
    "train": ("parallel_endpoints", "ensemble", "save_steps"),
}


def endpoint_key(
    model_cfg: dict, data_cfg: dict, train_cfg: dict, trainer_cfg: dict, sources: dict[str, str | None]
) -> dict[str, Any]:
    """The part of the config that determines a trained endpoint (besides its seed); `sources` holds
    the checksums of the corpus (its dataset's registry entry) and the tokenizer (glmc.data.fingerprint)."""
    keep = lambda section, node: {k: v for k, v in node.items() if k not in NOT_WEIGHTS.get(section, ())}
    return {
        "version": KEY_VERSION,
        "model": model_cfg,
        "data": keep("data", data_cfg),
        "train": keep("train", train_cfg),
        "trainer": keep("trainer", trainer_cfg),
        "sources": dict(sources),
    }


def config_hash(key: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class CorruptEntryError(RuntimeError):
    """A cache entry failed its integrity checks; it has been moved aside."""


@dataclass
class EndpointCache:
    root: Path

    def __post_init__(self):
        self.root = Path(self.root)
        self.remove_stale_tmp()

    def remove_stale_tmp(self, max_age: float = STALE_TMP_SECONDS) -> list[Path]:
        """Temporary folders of writers killed before they finished (older than `max_age` seconds)."""
        removed = []
        now = time.time()
        for tmp in self.root.glob("*/.tmp-*"):
            try:
                if now - tmp.stat().st_mtime > max_age:
                    shutil.rmtree(tmp)
                    removed.append(tmp)
            except FileNotFoundError:  # another process removed it first
                pass
        return removed

    def entry(self, key: dict[str, Any], seed: int) -> Path:
        return self.root / config_hash(key) / f"seed_{seed}"

    def training_dir(self, key: dict[str, Any], seed: int) -> Path:
        """Where the training of `seed` checkpoints until its entry is cached."""
        return self.root / config_hash(key) / f".train_seed_{seed}"

    def lock_path(self, key: dict[str, Any], seed: int) -> Path:
        return self.root / config_hash(key) / f".seed_{seed}.lock"

    @contextmanager
    def lock(self, key: dict[str, Any], seed: int, poll: float = 0.5) -> Iterator[bool]:
        """Hold the entry's file lock while it is checked, trained and saved, so that two runs never
        train one endpoint into one checkpoint folder. Yields whether another run held it first (then
        the entry it finished is usually there to load)."""
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            yield False  # ranks started together (torchrun) train each endpoint together, through DDP
            return
        path = self.lock_path(key, seed)
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(path))
        waited = False
        try:
            lock.acquire(timeout=0)
        except Timeout:
            waited = True
            log.info("seed %d: another run is training this endpoint (%s); waiting for it", seed, path)
            lock.acquire(poll_interval=poll)
        try:
            yield waited
        finally:
            lock.release()

    def has(self, key: dict[str, Any], seed: int) -> bool:
        """Whether a complete entry exists; an entry missing a file is moved aside (False)."""
        entry = self.entry(key, seed)
        if not entry.exists():
            return False
        missing = [name for name in (WEIGHTS, META) if not (entry / name).is_file()]
        if missing:
            self._discard(entry, f"lacks {' and '.join(missing)}")
            return False
        return True

    def _discard(self, entry: Path, reason: str) -> None:
        try:
            move_aside(entry, f"is a damaged endpoint cache entry ({reason})")
        except FileNotFoundError:  # another process moved it first
            pass

    def _corrupt(self, entry: Path, reason: str) -> CorruptEntryError:
        self._discard(entry, reason)
        return CorruptEntryError(f"cache entry {entry} {reason}; moved aside")

    def load(self, key: dict[str, Any], seed: int, model: torch.nn.Module) -> dict[str, Any]:
        """Fill `model` (already built from the same config) in place; return the stored metadata.

        Raises CorruptEntryError (after moving the entry aside) when the entry fails its checks."""
        entry = self.entry(key, seed)
        try:
            meta = json.loads((entry / META).read_text())
            if not isinstance(meta, dict) or not isinstance(meta.get("metrics"), dict) or "key" not in meta:
                raise ValueError("not an entry's metadata")
        except (OSError, UnicodeDecodeError, ValueError) as err:
            raise self._corrupt(entry, f"has an unreadable {META} ({err})") from err
        self._check_meta(entry, meta, key, seed)
        expected = meta["sha256"]
        try:
            actual = file_sha256(entry / WEIGHTS)
        except OSError as err:
            raise self._corrupt(entry, f"has an unreadable {WEIGHTS} ({err})") from err
        if actual != expected:
            raise self._corrupt(
                entry, f"has a {WEIGHTS} whose sha256 {actual[:12]}... is not the recorded {expected[:12]}..."
            )
        try:
            load_model(model, str(entry / WEIGHTS), strict=True, device="cpu")
        except (SafetensorError, RuntimeError, OSError, ValueError) as err:
            raise self._corrupt(entry, f"has a {WEIGHTS} that does not load ({err})") from err
        bad = [name for name, p in model.named_parameters() if not torch.isfinite(p).all()]
        if bad:
            raise self._corrupt(entry, f"holds non-finite weights ({bad[0]})")
        return meta

    def _check_meta(self, entry: Path, meta: dict[str, Any], key: dict[str, Any], seed: int) -> None:
        """CorruptEntryError unless meta.json records this key, this seed and a checksum: an entry without one
        (written before checksums, or edited) has nothing that vouches for its weights."""
        if meta["key"] != json.loads(json.dumps(key)):
            raise self._corrupt(
                entry, f"holds a different config than its hash claims (its {META} records another key)"
            )
        if meta.get("seed") != seed:
            raise self._corrupt(entry, f"records seed {meta.get('seed')!r} in its {META}, not seed {seed}")
        checksum = meta.get("sha256")
        if not isinstance(checksum, str) or len(checksum) != 64:
            raise self._corrupt(
                entry, f"records no sha256 of {WEIGHTS} in its {META}, so its weights cannot be checked"
            )

    def save(self, key: dict[str, Any], seed: int, model: torch.nn.Module, metrics: dict[str, Any]) -> Path:
        """Write the entry of `seed` into a temporary folder and rename it into place; NoRoomError
        (glmc.train.storage) where the disk has no room for it."""
        final = self.entry(key, seed)
        bad = [name for name, p in model.named_parameters() if not torch.isfinite(p).all()]
        if bad:
            raise ValueError(f"refusing to cache seed {seed} at {final}: {bad[0]} is not finite")
        what, umask = f"the endpoint of seed {seed}", current_umask()
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
        except OSError as err:
            refusal = no_room_error(err, what, final.parent, state_bytes(model))
            if refusal is not None:
                raise refusal from err
            raise
        try:
            os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's 0700 would hide the entry from the user's group
            save_model(model, str(tmp / WEIGHTS))
            os.chmod(tmp / WEIGHTS, 0o666 & ~umask)  # safetensors writes 0600
            meta = {"key": key, "seed": seed, "metrics": metrics, "sha256": file_sha256(tmp / WEIGHTS)}
            # allow_nan=False: non-finite metrics are an error, not a JSON extension
            (tmp / META).write_text(json.dumps(meta, indent=2, sort_keys=True, allow_nan=False))
            if final.exists():  # a concurrent run finished the same entry first: keep theirs
                shutil.rmtree(tmp)
            else:
                os.replace(tmp, final)
        except BaseException as err:
            room = isinstance(err, (OSError, SafetensorError))  # measured before the partial entry goes
            refusal = no_room_error(err, what, final.parent, state_bytes(model)) if room else None
            shutil.rmtree(tmp, ignore_errors=True)
            if refusal is not None:
                raise refusal from err
            raise
        return final
