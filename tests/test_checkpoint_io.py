"""Training checkpoints are written straight to a temporary file and renamed into place
(glmc.train.checkpoint_io): what Lightning reads back is what it wrote, nothing is left beside it, a failed
write keeps the previous file, and every Trainer glmc builds writes this way unless told otherwise."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from glmc.train.checkpoint_io import DirectCheckpointIO
from glmc.train.trainer import trainer_factory


def test_a_checkpoint_is_written_whole_or_not_at_all(tmp_path):
    io = DirectCheckpointIO()
    path = tmp_path / "run" / "last.ckpt"
    state = {"state_dict": {"w": torch.arange(6.0).reshape(2, 3)}, "epoch": 3}
    io.save_checkpoint(state, path)
    loaded = io.load_checkpoint(path)
    assert loaded["epoch"] == 3 and torch.equal(loaded["state_dict"]["w"], state["state_dict"]["w"])
    assert sorted(p.name for p in path.parent.iterdir()) == ["last.ckpt"]
    with pytest.raises(Exception):  # noqa: B017 - whatever pickling raises, the old file stays
        io.save_checkpoint({"state_dict": {}, "bad": lambda: None}, path)
    assert io.load_checkpoint(path)["epoch"] == 3 and sorted(p.name for p in path.parent.iterdir()) == ["last.ckpt"]


def test_glmcs_trainers_write_checkpoints_this_way_unless_plugins_are_named(tmp_path):
    make = trainer_factory(OmegaConf.create({"_target_": "lightning.pytorch.Trainer", "accelerator": "cpu"}))
    assert isinstance(make(default_root_dir=str(tmp_path), logger=False).strategy.checkpoint_io, DirectCheckpointIO)
    named = make(default_root_dir=str(tmp_path), logger=False, plugins=[])
    assert not isinstance(named.strategy.checkpoint_io, DirectCheckpointIO)
