"""glmc.train.denormals: subnormals flushed in every thread of torch's OpenMP team (not the Python thread
alone), only while a CPU Trainer fits, and an endpoint trained so keyed apart from one trained keeping them."""

from __future__ import annotations

import platform
import sys

import lightning as L
import pytest
import sklearn.datasets  # noqa: F401  loads scikit-learn's own OpenMP runtime, whose threads torch never uses
import torch

from glmc.pipeline.endpoints import cache_key
from glmc.train.denormals import SUBNORMAL_BITS, flush_denormals_everywhere, flushes_here, flushing_now
from glmc.train.trainer import trainer_factory

from conftest import compose_config

LINUX_X86 = sys.platform == "linux" and platform.machine() in ("x86_64", "AMD64")


def _flushed_share() -> float:
    """The share of a large subnormal tensor's halves that come out zero: 1.0 where every thread of the team
    that computes them flushes, 0.5 where only the Python thread does (on two threads)."""
    x = torch.full((1 << 22,), SUBNORMAL_BITS, dtype=torch.int32).view(torch.float32)  # no conversion to flush
    return float((x * 0.5 == 0).float().mean())


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    _flushed_share()  # the team exists before the flag is set: its threads must be reached where they are
    yield
    flush_denormals_everywhere(False)
    torch.set_num_threads(before)


@pytest.mark.skipif(not LINUX_X86, reason="the flag is set through torch's OpenMP runtime on Linux x86 here")
def test_flush_reaches_every_thread_of_the_team(two_threads):
    assert flushes_here()
    assert _flushed_share() == 0.0
    torch.set_flush_denormal(True)  # the Python thread alone: its team-mate goes on with subnormals
    assert _flushed_share() == 0.5
    assert flush_denormals_everywhere(True)
    assert _flushed_share() == 1.0
    assert flush_denormals_everywhere(False)
    assert _flushed_share() == 0.0


class _Probe(L.LightningModule):
    """One step; records whether subnormals were flushed while it ran."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(1))
        self.flushed_in_step: list[float] = []

    def training_step(self, batch, batch_idx):
        self.flushed_in_step.append(_flushed_share())
        return (self.weight * batch[0]).sum()

    def train_dataloader(self):
        return [torch.ones(1)]

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit_probe(flush: bool) -> list[float]:
    cfg = compose_config("logger=none", f"trainer.flush_denormals={flush}").trainer
    probe = _Probe()
    trainer = trainer_factory(cfg)(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(probe)
    return probe.flushed_in_step


@pytest.mark.skipif(not LINUX_X86, reason="the flag is set through torch's OpenMP runtime on Linux x86 here")
@pytest.mark.parametrize("flush", [True, False])
def test_a_cpu_trainer_flushes_while_it_fits_only(two_threads, flush):
    assert _fit_probe(flush) == [1.0 if flush else 0.0]
    assert _flushed_share() == 0.0  # off again after the fit
    assert not flushing_now()


@pytest.mark.skipif(not LINUX_X86, reason="the flag is set through torch's OpenMP runtime on Linux x86 here")
def test_a_process_that_flushed_before_a_fit_still_flushes_after_it(two_threads):
    assert flush_denormals_everywhere(True)  # the user's own choice, for the whole process
    assert flushing_now()
    flushes_here.cache_clear()
    assert flushes_here()  # its probe of the CPU leaves the flag as it found it
    assert flushing_now() and _flushed_share() == 1.0
    assert _fit_probe(True) == [1.0]
    assert _flushed_share() == 1.0 and flushing_now()


def test_the_cache_key_says_whether_subnormals_were_flushed():
    flushing = cache_key(compose_config("logger=none"))
    keeping = cache_key(compose_config("logger=none", "trainer.flush_denormals=false"))
    assert "flush_denormals" not in flushing["trainer"] and "flush_denormals" not in keeping["trainer"]
    assert "subnormals" not in keeping["trainer"]  # as entries trained before the setting existed
    assert flushing["trainer"].get("subnormals") == ("flushed" if flushes_here() else None)
    assert {k: v for k, v in flushing["trainer"].items() if k != "subnormals"} == keeping["trainer"]
