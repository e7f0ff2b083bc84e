"""Shared fixtures: compose the real Hydra config the way run.py does, with overrides."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from glmc.config import register_configs

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
register_configs()

# GLMC_TEST_THREADS=1 runs torch's CPU kernels on one thread: the summation order of a one-core machine.
if os.environ.get("GLMC_TEST_THREADS"):
    torch.set_num_threads(int(os.environ["GLMC_TEST_THREADS"]))


def compose_config(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


@pytest.fixture
def tiny_overrides(tmp_path):
    """A seconds-long run whose endpoint cache lives in the test's own folder."""
    return ["debug=fast", f"cache_dir={tmp_path / 'endpoints'}", "logger=none"]


def pytest_collection_modifyitems(config, items):
    """`gpu` tests run only where CUDA is visible; everywhere else they are reported as skipped."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
