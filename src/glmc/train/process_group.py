"""Close the process group of spawned DDP ranks before they exit.

Under `ddp_spawn` / `ddp_fork` every rank is a child process that ends as soon as `fit` returns.
Left to the interpreter's exit, a rank could tear down its gloo process group while its peer was
still closing its side, and abort in C++ ("terminate called without an active exception") after a
successful fit. Here every rank meets the others at a barrier at the end of fit and then destroys
its group while Python is still running, so no rank leaves while another one is mid-teardown.
Ranks that outlive fit (plain `ddp`, where rank 0 is the main process and keeps evaluating with
the group) are left alone.
"""

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
