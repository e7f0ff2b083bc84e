"""SIGTERM (a cluster's preemption) ends a run as Ctrl-C does: it says how to resume, and exits non-zero."""

from __future__ import annotations

import os
import signal
import time

from glmc.train.resume import EpochCheckpoint

from conftest import ForkedRun


def test_sigterm_during_endpoint_training_prints_the_resume_line(tmp_path, monkeypatch):
    real = EpochCheckpoint.on_train_epoch_end

    def then_terminated(self, trainer, pl_module):  # in the forked run: a real signal at a known point
        real(self, trainer, pl_module)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(EpochCheckpoint, "on_train_epoch_end", then_terminated)
    args = [
        "debug=fast",
        "logger=none",
        "matcher.methods=[vanilla]",
        "train.max_epochs=200",  # stopped after its first epoch
        f"cache_dir={tmp_path / 'endpoints'}",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    log = tmp_path / "run.log"
    proc = ForkedRun(args, log)  # run.py's process, with this one's imports
    try:
        while proc.poll() is None:
            time.sleep(0.05)
    finally:
        proc.kill()
    found = list((tmp_path / "endpoints").glob("*/.train_seed_0/last.ckpt"))
    output = log.read_text()
    assert found, "no epoch checkpoint: " + output[-3000:]
    (line,) = [x for x in output.splitlines() if "interrupted while training endpoints" in x]
    print(f"\n  exit status {proc.returncode}: {line.strip()}")
    assert str(found[0]) in line and "run the same command again to resume" in line
    assert proc.returncode == 128 + signal.SIGTERM
    assert not (tmp_path / "run" / "results.json").exists()
