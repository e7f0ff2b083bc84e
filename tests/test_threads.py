"""threads=auto: torch's thread count from the usable cores, how busy other processes keep them and the
size of the work (glmc.threads)."""

from __future__ import annotations

import pytest
import torch

from glmc import threads
from glmc.threads import GRAIN, check_threads, choose_threads


@pytest.mark.parametrize(
    "cores,busy,work,expected",
    [
        (2, 0.0, None, 2),  # alone: every core
        (2, 0.4, None, 2),  # a core busy less than half the time is still ours
        (2, 0.6, None, 1),
        (2, 1.0, None, 1),  # one busy single-thread process on two cores: one thread
        (2, 2.0, None, 1),  # at least one
        (16, 1.0, None, 15),
        (16, 3.7, None, 12),
        (1, 0.0, None, 1),
        (16, 0.0, 5 * GRAIN, 5),  # one thread per grain of work
        (16, 0.0, GRAIN - 1, 1),
        (16, 10.0, 16 * GRAIN, 6),  # the busy cores bind first
        (2, -0.5, None, 2),  # a sample below zero (rounding) takes no core
    ],
)
def test_choice_from_cores_load_and_work(cores, busy, work, expected):
    assert choose_threads(cores, busy, work) == expected


@pytest.mark.parametrize("value", ["auto", 1, 8, None])
def test_accepted_settings(value):
    assert check_threads(value) is None


@pytest.mark.parametrize("value", [0, -2, "many", True, 1.5])
def test_refused_settings_name_the_key(value):
    assert check_threads(value) == f"threads={value!r}: use auto, a count of at least 1, or null for torch's default"
    with pytest.raises(ValueError, match="threads="):
        threads.configure(value)


@pytest.fixture
def policy(monkeypatch):
    """A fresh policy on four usable cores, torch's threads restored afterwards."""
    before = torch.get_num_threads()
    fresh = threads._Policy()
    fresh.original = 4  # as if torch had started with four threads
    monkeypatch.setattr(threads, "_POLICY", fresh)
    monkeypatch.setattr(threads, "usable_cores", lambda: [0, 1, 2, 3])
    samples = []
    monkeypatch.setattr(threads, "busy_cores", lambda cores: samples.pop(0))
    yield samples
    torch.set_num_threads(before)


def test_auto_chooses_again_at_each_stage(policy, monkeypatch):
    policy.extend([1.0, 3.0])
    threads.configure("auto")
    assert torch.get_num_threads() == 3  # one of four cores taken
    assert threads.adapt(None, "a stage") == 3  # within RESAMPLE_AFTER: the same sample, none taken
    monkeypatch.setattr(threads, "RESAMPLE_AFTER", -1.0)
    assert threads.adapt(2 * GRAIN, "a later stage") == 1 and torch.get_num_threads() == 1
    assert policy == []


def test_fixed_and_default_settings_leave_the_count_alone(policy):
    threads.configure(2)
    assert torch.get_num_threads() == 2 and threads.adapt(10 * GRAIN) is None
    threads.configure(None)
    assert threads.adapt() is None and torch.get_num_threads() == 2 and policy == []


def test_one_thread_ceiling_takes_no_sample(policy):
    threads._POLICY.original = 1  # OMP_NUM_THREADS=1: nothing to choose
    threads.configure("auto")
    assert threads.adapt() == 1 and torch.get_num_threads() == 1


def test_own_cores_are_read_from_proc_stat():
    cores = threads.usable_cores()
    assert cores and threads._core_times(cores) is not None
    assert 0.0 <= threads.busy_cores(cores, seconds=0.02) <= len(cores)
