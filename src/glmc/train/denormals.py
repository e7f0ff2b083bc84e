"""Subnormal floats flushed to zero on the CPU while a model trains (trainer.flush_denormals).

As training goes on, a float32 model's activations pick up subnormal values (below 1.2e-38; its weights,
gradients and AdamW moments held none in our runs), e.g. a GELU's far negative tail and its derivative's
exp(-x^2/2), and x86 cores take a microcode assist for every operation that reads or writes one. Training
the default digits ViT on two cores, a step went from 33 ms in its first epochs to 56 ms by epoch 20 (8
stacked members: 230 to 390 ms); with subnormals flushed it stays at 32 ms (230 ms). A subnormal is smaller
than any float32 a loss, weight or gradient of these models is made of, so flushing changes a result by
round-off, not by what it learns.

The setting lives in each thread's control register (MXCSR), and a thread of an OpenMP team keeps its own:
set in the Python thread alone, the team's other threads, which compute half of every parallel kernel on
two cores, would go on with subnormals (and a result would depend on the thread count). So the flag is set
in every thread of the team torch's kernels run on, through the OpenMP runtime's own entry point for a
parallel region (GOMP_parallel, which libgomp and LLVM's libomp both export). Where torch's runtime has no
such entry point, or the CPU cannot flush, nothing is changed and `flushes_here()` says so: the endpoint
cache key records whether an endpoint was trained flushing (glmc.pipeline.endpoints.cache_key)."""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback

_REGION_BODY = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
SUBNORMAL_BITS = 0x00400000  # a float32 below the smallest normal number (1.2e-38): 5.9e-39


@functools.cache
def _gomp_parallel():
    """GOMP_parallel of the OpenMP runtime torch's CPU kernels run on, or None. Looked up through torch's
    own library, which finds the runtime it was linked with: another package may have loaded a copy of its
    own (scikit-learn ships one), whose threads torch never uses."""
    for library in sorted((Path(torch.__file__).parent / "lib").glob("libtorch_cpu.*")):
        try:
            parallel = ctypes.CDLL(str(library)).GOMP_parallel
        except (OSError, AttributeError):  # not linked with an OpenMP runtime that has the GNU entry point
            continue
        parallel.argtypes = [_REGION_BODY, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
        parallel.restype = None
        return parallel
    return None


@functools.cache
def flushes_here() -> bool:
    """Whether this process can flush subnormals in every thread torch's CPU kernels run on."""
    if _gomp_parallel() is None:
        return False
    return bool(torch.set_flush_denormal(flushing_now()))  # True where the CPU has the flag; left as it was


def flushing_now() -> bool:
    """Whether the calling thread flushes subnormals now (read from one product, so nothing is changed)."""
    subnormal = torch.tensor([SUBNORMAL_BITS], dtype=torch.int32).view(torch.float32)  # no conversion to flush
    return bool(subnormal.mul(1.0).item() == 0.0)


def flush_denormals_everywhere(on: bool) -> bool:
    """Subnormals flushed to zero (`on`) or kept, in this thread and in every thread of torch's OpenMP team;
    False (nothing changed) where that cannot be done (`flushes_here`)."""
    if not flushes_here():
        return False
    outcomes: list[bool] = []
    body = _REGION_BODY(lambda _: outcomes.append(bool(torch.set_flush_denormal(on))))
    _gomp_parallel()(body, None, max(1, torch.get_num_threads()), 0)
    torch.set_flush_denormal(on)  # the calling thread too, whichever thread the team's first one was
    return all(outcomes)


class FlushDenormals(Callback):
    """Subnormals flushed on the CPU from the fit's start to its end, failed or not (see the module); after it,
    as the process had them before (a process that flushed already goes on flushing)."""

    def __init__(self):
        self.flushing = False
        self.flushed_before = False  # a process that flushed already (its own choice) flushes after the fit too

    def on_fit_start(self, trainer, pl_module) -> None:
        self.flushed_before = flushing_now()
        self.flushing = flush_denormals_everywhere(True)

    def on_fit_end(self, trainer, pl_module) -> None:
        self._restore()

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._restore()

    def teardown(self, trainer, pl_module, stage) -> None:
        self._restore()

    def _restore(self) -> None:
        if self.flushing:
            flush_denormals_everywhere(self.flushed_before)
            self.flushing = False
