"""Close the process group of spawned DDP ranks (ddp_spawn, ddp_fork) at a barrier before they exit: left to
the interpreter's exit, a rank could abort in C++ while its peer is mid-teardown."""

from __future__ import annotations

import torch.distributed as dist
from lightning.pytorch.callbacks import Callback


def _spawned_ranks(trainer) -> bool:
    from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher

    return isinstance(getattr(trainer.strategy, "launcher", None), _MultiProcessingLauncher)


class CloseProcessGroup(Callback):
    """At the end of fit, in child-process ranks only: barrier, then destroy the process group."""

    def teardown(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit" or not dist.is_available() or not dist.is_initialized():
            return
        if trainer.world_size < 2 or not _spawned_ranks(trainer):
            return
        dist.barrier()
        dist.destroy_process_group()
