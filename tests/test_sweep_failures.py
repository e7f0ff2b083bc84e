"""A multirun tells each failed job at once, goes on, lists the failures at its end and exits 1; job
folders are named without the path-valued settings."""

from __future__ import annotations

import json

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from glmc.pipeline.sweep_report import FAILED_FILE, failed_jobs

from conftest import CONF, run_script


def test_failed_jobs_are_told_at_once_and_listed_at_the_end(tmp_path, monkeypatch, capsys):
    sweep = tmp_path / "sweep"
    code, _, err = run_script(monkeypatch, capsys, "-m", "threads=0,-1", "logger=none", f"hydra.sweep.dir={sweep}")
    assert code == 1, err
    # each job's line comes as it fails, before the closing list
    first = err.index("Error: job 0 (threads=0 logger=none) failed: threads=0: use auto, a count of at least 1")
    assert err.index("Error: job 1 (threads=-1 logger=none) failed", first) < err.index("2 jobs failed:")
    assert "Traceback" not in err
    records = failed_jobs(sweep)
    assert [r["overrides"] for r in records] == [["threads=0", "logger=none"], ["threads=-1", "logger=none"]]
    folders = [str(sweep / "0_logger=none,threads=0"), str(sweep / "1_logger=none,threads=-1")]
    assert [r["folder"] for r in records] == folders


def test_every_path_valued_setting_is_left_out_of_job_folder_names():
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", return_hydra_config=True)
    excluded = set(cfg.hydra.job.config.override_dirname.exclude_keys)
    task = OmegaConf.to_container(cfg, resolve=False)
    task.pop("hydra")

    def keys(node, prefix=""):
        for k, v in node.items():
            yield from keys(v, f"{prefix}{k}.") if isinstance(v, dict) else [f"{prefix}{k}"]

    names = ("path", "paths", "root", "cache_dir", "tokenizer_path")
    path_keys = {k for k in keys(task) if k.rsplit(".", 1)[-1] in names or k.endswith(("_dir", "_path"))}
    assert {"endpoints.paths", "cache_dir", "data.path"} <= path_keys  # the walk finds them
    assert path_keys <= excluded, f"path-valued keys that would nest job folders: {sorted(path_keys - excluded)}"


def test_a_job_that_finishes_clears_its_earlier_failure(tmp_path):
    from glmc.pipeline.sweep_report import clear_failed_job, record_failed_job

    record_failed_job(tmp_path / "3_x=1", 3, ["x=1"], "boom")
    assert json.loads((tmp_path / "3_x=1" / FAILED_FILE).read_text())["message"] == "boom"
    clear_failed_job(tmp_path / "3_x=1")
    assert failed_jobs(tmp_path) == []
