"""SIGTERM (a cluster's preemption) ends a run as Ctrl-C does: it says how to resume, and exits non-zero."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from conftest import ROOT


def test_sigterm_during_endpoint_training_prints_the_resume_line(tmp_path):
    command = [
        sys.executable,
        "run.py",
        "debug=fast",
        "logger=none",
        "matcher.methods=[vanilla]",
        "train.max_epochs=200",  # far longer than the test waits
        f"cache_dir={tmp_path / 'endpoints'}",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    log = tmp_path / "run.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        try:
            found, deadline = [], time.monotonic() + 120
            while proc.poll() is None and time.monotonic() < deadline and not found:
                found = list((tmp_path / "endpoints").glob("*/.train_seed_0/last.ckpt"))  # an epoch has ended
                time.sleep(0.05)
            assert found, "training did not start: " + log.read_text()[-3000:]
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        finally:
            proc.kill()
            proc.wait()
    output = log.read_text()
    (line,) = [x for x in output.splitlines() if "interrupted while training endpoints" in x]
    print(f"\n  exit status {proc.returncode}: {line.strip()}")
    assert str(found[0]) in line and "run the same command again to resume" in line
    assert proc.returncode == 128 + signal.SIGTERM
    assert not (tmp_path / "run" / "results.json").exists()
