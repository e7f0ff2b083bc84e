"""Training batches sliced from the token windows on the training device (glmc.data.device_batches) are
the DataLoader's batches in the DataLoader's order, so training on them gives the same losses; on CPU the
training loader stays the DataLoader unless asked."""

from __future__ import annotations

import itertools
import types

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader, Subset, TensorDataset

from glmc.data.device_batches import DeviceBatches, token_windows
from glmc.data.module import DataModule
from glmc.data.text import TokenWindows
from glmc.models.build import build_model
from glmc.pipeline import ensemble
from glmc.pipeline.endpoints import cache_key, endpoint_seeds
from glmc.train.divergence import DivergenceError, DivergenceGuard
from glmc.train.endpoint import EndpointModule
from glmc.train.ensemble import _order_state
from glmc.train.trainer import trainer_factory

from conftest import compose_config

TEXT = ("experiment=demo_text", "debug=fast")


def _data(*overrides: str, device_batches: bool | None = None, **state) -> DataModule:
    data = DataModule(compose_config(*TEXT, *overrides).data, seed=3)
    data.setup()
    data.device_batches = device_batches
    for name, value in state.items():
        setattr(data, name, value)
    return data


def _as_lightning_takes(loader):
    """An epoch of `loader` as Lightning's fit loop takes it: its length's worth of batches, never run past
    its end (which would draw the shuffling sampler's next permutation)."""
    return itertools.islice(loader, len(loader))


def _same_epochs(loader, sliced, epochs: int = 2) -> None:
    for _ in range(epochs):  # the generator carries on into the next epoch alike
        pairs = list(zip(_as_lightning_takes(loader), _as_lightning_takes(sliced), strict=True))
        assert pairs and all(torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in pairs)
        if loader.generator is not None:
            assert torch.equal(loader.generator.get_state(), sliced.generator.get_state())


def test_sliced_batches_are_the_loaders_in_its_order():
    loader, sliced = _data().train_dataloader(), _data(device_batches=True).train_dataloader()
    assert isinstance(loader, DataLoader) and isinstance(sliced, DeviceBatches) and len(loader) == len(sliced)
    _same_epochs(loader, sliced)


def test_positioned_and_resumed_orders_are_kept():
    """Learned matching positions the order at a step; a resumed endpoint continues the generator."""
    positioned = _data(train_start_step=5).train_dataloader()
    _same_epochs(positioned, _data(device_batches=True, train_start_step=5).train_dataloader())
    first = _data().train_dataloader()
    list(first)
    state = first.generator.get_state()
    resumed = _data(train_generator_state=state).train_dataloader()
    _same_epochs(resumed, _data(device_batches=True, train_generator_state=state).train_dataloader(), epochs=1)


def test_only_plain_token_windows_are_sliced():
    windows = TokenWindows(torch.arange(12), 4)
    assert torch.equal(token_windows(Subset(windows, [2, 0])), windows.windows[[2, 0]])

    class Drawn(TokenWindows):  # a subclass may fetch otherwise, as masked-LM windows draw masks
        pass

    assert token_windows(Drawn(torch.arange(12), 4)) is None
    data = DataModule(compose_config(*TEXT).data, seed=0)
    data.train_set, data.device_batches = TensorDataset(torch.zeros(8, 2), torch.zeros(8)), True
    assert isinstance(data.train_dataloader(), DataLoader)


class _Losses(Callback):
    def __init__(self):
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["loss"]))


def _first_losses(device_batches: bool | None, steps: int = 4) -> tuple[list[float], type]:
    cfg = compose_config(*TEXT)
    L.seed_everything(0, verbose=False)
    module = EndpointModule(build_model(cfg.model), cfg.train, cfg.data.task)
    data = DataModule(cfg.data, seed=0)
    data.device_batches = device_batches
    record = _Losses()
    trainer = trainer_factory(cfg.trainer)(
        max_steps=steps, logger=False, enable_checkpointing=False, callbacks=[record], limit_val_batches=0
    )
    trainer.fit(module, datamodule=data)
    assert all(group["fused"] for group in trainer.optimizers[0].param_groups)  # the CPU's fused AdamW too
    return record.losses, type(trainer.train_dataloader)


def test_cpu_training_keeps_the_loader_and_the_sliced_path_its_losses():
    epoch = len(_data().train_dataloader())
    losses, kind = _first_losses(None, steps=2 * epoch + 2)
    assert kind is DataLoader  # on CPU, as before
    sliced, kind = _first_losses(True, steps=2 * epoch + 2)
    assert kind is DeviceBatches and len(losses) == 2 * epoch + 2
    assert sliced == losses  # in later epochs too: the same order


def test_divergence_on_a_device_is_named_at_its_first_step_when_read():
    guard = DivergenceGuard("seed 3", "lower train.lr")
    guard._pending = [(7, 0, 7, torch.tensor(1.0)), (8, 0, 8, torch.tensor(float("nan"))), (9, 1, 0, torch.tensor(1.0))]
    with pytest.raises(DivergenceError, match=r"seed 3: training loss is nan at step 8 \(epoch 0, batch 8\)"):
        guard.check_pending()
    guard.check_pending()  # read once: nothing left


@pytest.mark.gpu
def test_on_a_gpu_batches_are_sliced_there_with_fused_adamw_and_float32_weights():
    cfg = compose_config(*TEXT, "trainer=gpu")
    L.seed_everything(0, verbose=False)
    module = EndpointModule(build_model(cfg.model), cfg.train, cfg.data.task)
    data = DataModule(cfg.data, seed=0)
    trainer = trainer_factory(cfg.trainer)(max_steps=3, logger=False, enable_checkpointing=False, limit_val_batches=0)
    trainer.fit(module, datamodule=data)
    assert isinstance(trainer.train_dataloader, DeviceBatches) and trainer.train_dataloader.windows.is_cuda
    assert all(group["fused"] for group in trainer.optimizers[0].param_groups)
    native = torch.cuda.is_bf16_supported(including_emulation=False)
    assert trainer.precision == ("bf16-mixed" if native else "32-true")  # trainer=gpu: precision auto
    assert {p.dtype for p in module.model.parameters()} == {torch.float32}  # master weights
    cpu = DataModule(cfg.data, seed=0)
    cpu.setup()
    for (a, b), (c, d) in zip(cpu.train_dataloader(), data.train_dataloader(), strict=True):
        assert torch.equal(a, c.cpu()) and torch.equal(b, d.cpu())


def test_fused_adamw_runs_on_the_cpu_and_is_kept_from_clipping_under_every_autocast_precision():
    """Lightning's autocast plugin refuses to clip a fused optimizer's gradients under bf16-mixed as
    well as 16-mixed (found on an H100, where trainer=gpu resolves to bf16-mixed)."""
    from lightning.pytorch.plugins.precision import MixedPrecision, Precision

    from glmc.train.endpoint import fused_adamw_suits, fused_clipping_refused

    assert fused_clipping_refused(MixedPrecision("bf16-mixed", "cpu"), 1.0)
    assert fused_adamw_suits([torch.zeros(2)], L.LightningModule())  # on the CPU, outside a fit: nothing clips
    assert not fused_adamw_suits([torch.zeros(2), torch.zeros(2, device="meta")], L.LightningModule())
    assert not fused_clipping_refused(MixedPrecision("bf16-mixed", "cpu"), 0.0)
    assert not fused_clipping_refused(Precision(), 1.0)


def test_without_a_trainer_the_training_device_decides_and_starts_no_workers():
    """An ensemble's members (glmc.pipeline.ensemble) are told the device; their loaders start no workers of
    their own (the ensemble stacks their batches) and a step-positioned order shows its place."""
    cuda = _data(training_device=torch.device("cuda"))
    assert cuda._batch_device() == torch.device("cuda")  # batches sliced there, as a seed alone's
    assert cuda._loader_options(train=True) == {"num_workers": cuda.cfg.num_workers}
    assert _data(training_device=torch.device("cpu"))._batch_device() is None  # the DataLoader, as before
    positioned = _data(device_batches=True, train_start_step=5).train_dataloader()
    assert positioned.generator is None and positioned.sampler.next_step == 5


def test_an_ensembles_members_slice_one_copy_of_the_windows_into_their_loaders_batches(monkeypatch):
    cfg = compose_config("debug=fast", "model=gpt2_text", "data=pydoc", "data.limit_train=128", "logger=none")
    seeds = [endpoint_seeds(cfg, s) for s in (0, 1)]
    loaded = ensemble._members(cfg, seeds, None)
    monkeypatch.setattr(DataModule, "_batch_device", lambda self: torch.device("cpu"))  # as on a GPU
    sliced = ensemble._members(cfg, seeds, None)
    assert all(isinstance(loader, DataLoader) for loader in loaded.train_loaders)
    first, second = sliced.train_loaders
    assert isinstance(first, DeviceBatches) and second.windows is first.windows
    for _ in range(2):  # each member's order, and the stream its fetches draw from, carry on alike
        epochs = (_as_lightning_takes(module.train_dataloader()) for module in (loaded, sliced))
        pairs = list(zip(*epochs, strict=True))
        assert pairs and all(torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in pairs)
        assert all(map(torch.equal, loaded.fetch_streams, sliced.fetch_streams))
        for a, b in zip(loaded.train_loaders, sliced.train_loaders):
            assert torch.equal(_order_state(a), _order_state(b))


def test_the_cache_key_says_where_batches_are_sliced_on_a_gpu(monkeypatch):
    """Entries trained on sliced batches before they kept the loader's order past the first epoch are not
    taken for the ones trained now; every other key stays as it was."""
    causal = compose_config(*TEXT, "logger=none")
    assert "batches" not in cache_key(causal)["trainer"]  # on the CPU: the loader, as before
    monkeypatch.setattr("glmc.train.trainer.resolve_device", lambda accelerator: torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert cache_key(causal)["trainer"]["batches"] == "sliced_in_loader_order"
    assert "batches" not in cache_key(compose_config("logger=none"))["trainer"]  # images: a DataLoader
    two = compose_config(*TEXT, "logger=none", "trainer.devices=2")
    assert "batches" not in cache_key(two)["trainer"]  # one process per device: a DataLoader each
    named = compose_config(*TEXT, "logger=none", "trainer.devices=[0]")  # one device by its index
    assert cache_key(named)["trainer"]["batches"] == "sliced_in_loader_order"


@pytest.mark.gpu
def test_on_a_gpu_an_ensembles_members_train_on_batches_sliced_there(tmp_path):
    cfg = compose_config("debug=fast", "model=gpt2_text", "data=pydoc", "data.limit_train=128", "trainer=gpu")
    seeds = [endpoint_seeds(cfg, s) for s in (0, 1)]
    no_tracker = types.SimpleNamespace(lightning_logger=lambda *args: False)
    module = ensemble._fit(cfg, tmp_path, no_tracker, seeds, "")
    first, second = module.train_loaders
    assert isinstance(first, DeviceBatches) and first.windows.is_cuda and second.windows is first.windows
    inputs, _ = next(iter(module.train_dataloader()))
    assert inputs.is_cuda and inputs.shape[0] == 2
    assert all(torch.isfinite(p).all() for p in module.stacked)
