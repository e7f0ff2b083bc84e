"""Spawned DDP ranks close their process group at the end of fit; ranks that outlive fit keep it."""

from types import SimpleNamespace

import pytest
import torch.distributed as dist
from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher

from glmc.train.process_group import CloseProcessGroup
from glmc.train.trainer import trainer_factory


@pytest.fixture
def group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def _trainer(launcher_type):
    launcher = object.__new__(launcher_type)  # only its type is read
    return SimpleNamespace(world_size=2, strategy=SimpleNamespace(launcher=launcher))


def test_spawned_rank_destroys_its_group_after_fit(group):
    CloseProcessGroup().teardown(_trainer(_MultiProcessingLauncher), None, "fit")
    assert not dist.is_initialized()


@pytest.mark.parametrize(
    ("launcher_type", "stage"),
    [(_SubprocessScriptLauncher, "fit"), (_MultiProcessingLauncher, "validate")],
)
def test_group_kept_where_the_rank_goes_on(group, launcher_type, stage):
    CloseProcessGroup().teardown(_trainer(launcher_type), None, stage)
    assert dist.is_initialized()


def test_every_trainer_from_the_factory_carries_the_callback_after_the_callers():
    from lightning.pytorch.callbacks import Callback
    from omegaconf import OmegaConf

    from glmc.config import TrainerConfig

    marker = Callback()
    trainer = trainer_factory(OmegaConf.structured(TrainerConfig(accelerator="cpu")))(
        callbacks=[marker], logger=False, enable_checkpointing=False
    )
    mine = [c for c in trainer.callbacks if c is marker or isinstance(c, CloseProcessGroup)]
    assert mine[0] is marker and isinstance(mine[1], CloseProcessGroup) and len(mine) == 2
