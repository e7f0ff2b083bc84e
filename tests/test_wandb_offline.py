"""W&B logging runs offline without network, one run per stage in the experiment's group, with
stable metric keys, one curve run per method and seed pair, and finishes even when the run fails.

wandb has no reader for offline runs, so besides the run objects in-process the tests read the
`run-<id>.wandb` files on disk (a LevelDB-style log of protobuf records, the data `wandb sync` uploads).
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import pytest

from glmc.pipeline.run import run_pipeline
from glmc.pipeline.tracking import Tracker

from conftest import compose_config


@pytest.fixture(autouse=True)
def no_wandb_network(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in (
        "WANDB_API_KEY",
        "WANDB_MODE",
        "WANDB_ENTITY",
        "WANDB_PROJECT",
        "WANDB_RUN_GROUP",
        "WANDB_JOB_TYPE",
        "WANDB_NAME",
        "WANDB_TAGS",
        "WANDB_DIR",
    ):
        monkeypatch.delenv(var, raising=False)
    # artifact staging and caches in the test's folder, not in the home directory
    for var in ("WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb_home"))


# -- reading offline runs ------------------------------------------------------------------------------

_BLOCK, _HEADER = 32768, 7  # LevelDB log: 32 KiB blocks, 7-byte record headers (crc32, length, kind)
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _records(wandb_file: Path) -> list:
    """The protobuf records of one `run-<id>.wandb` file, in order."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = wandb_file.read_bytes()
    ident, magic, _version = struct.unpack("<4sHB", data[:_HEADER])
    assert ident == b":W&B" and magic == 0xBEE1, f"{wandb_file} is not a W&B transaction log"
    records, chunks, pos = [], [], _HEADER
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:  # the tail of a block too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        if kind == 0:  # zero padding up to the end of the block
            pos += left
            continue
        if pos + _HEADER + length > len(data):  # still being written
            break
        chunk = data[pos + _HEADER : pos + _HEADER + length]
        pos += _HEADER + length
        if kind in (_FULL, _FIRST):
            chunks = [chunk]
        else:
            chunks.append(chunk)
        if kind in (_FULL, _LAST):
            record = pb.Record()
            record.ParseFromString(b"".join(chunks))
            records.append(record)
            chunks = []
    return records


def _key(item) -> str:
    """The top-level metric key of a history or summary item (tables and images are nested under it)."""
    return item.nested_key[0] if item.nested_key else item.key


def _offline_run(folder: Path, wait_s: float = 180.0) -> dict:
    """What one offline run folder holds: its run record and config, metric keys, history rows,
    metric definitions, artifacts and exit code.

    `run.finish()` can return before wandb's service has written the transaction log out, so this
    waits (up to wait_s) for the run's exit record.
    """
    deadline = time.monotonic() + wait_s
    while True:
        run = _parse_run(folder)
        if run["exit_code"] is not None:
            return run
        assert time.monotonic() < deadline, f"{folder}: no exit record after {wait_s} s"
        time.sleep(0.05)


def _parse_run(folder: Path) -> dict:
    (wandb_file,) = folder.glob("run-*.wandb")
    run = {
        "history": set(),
        "rows": [],
        "metrics": {},
        "summary": {},
        "artifacts": {},
        "exit_code": None,
        "folder": folder,
    }
    for r in _records(wandb_file):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            run.update(
                group=r.run.run_group,
                job_type=r.run.job_type,
                name=r.run.display_name,
                start=(r.run.start_time.seconds, r.run.start_time.nanos),
                config={i.key: json.loads(i.value_json) for i in r.run.config.update if i.key != "_wandb"},
            )
        elif kind == "history":
            run["history"] |= {_key(i) for i in r.history.item}
            # plain values of one logged row, without wandb's own bookkeeping keys
            run["rows"].append(
                {
                    _key(i): json.loads(i.value_json)
                    for i in r.history.item
                    if len(i.nested_key) <= 1 and not _key(i).startswith("_")
                }
            )
        elif kind == "metric":  # define_metric: a name or glob and the metric it is plotted against
            run["metrics"][r.metric.name or r.metric.glob_name] = r.metric.step_metric
        elif kind == "summary":  # plain values only; media and tables are dicts spread over nested keys
            for i in r.summary.update:
                if len(i.nested_key) <= 1:
                    run["summary"][_key(i)] = json.loads(i.value_json)
        elif kind == "artifact":
            a = r.artifact
            run["artifacts"][a.name] = (a.type, sorted(e.path for e in a.manifest.contents))
        elif kind == "exit":
            run["exit_code"] = r.exit.exit_code
    return run


def _offline_runs(run_dir: Path) -> list[dict]:
    """The offline runs under run_dir/wandb in the order they started (folder names only have seconds)."""
    runs = [_offline_run(f) for f in (Path(run_dir) / "wandb").glob("offline-run-*")]
    return sorted(runs, key=lambda r: r["start"])


def _results_files(run_dir: Path) -> None:
    """results.json and a small barrier.png, as the pipeline writes them before log_results."""
    from PIL import Image

    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "results.json").write_text(json.dumps({"experiment": "debug"}))
    Image.new("RGB", (8, 6), (200, 30, 30)).save(run_dir / "barrier.png")


RESULTS = {
    "endpoints": [
        {"seed": 0, "test_loss": 0.1, "test_accuracy": 0.9},
        {"seed": 1, "test_loss": 0.12, "test_accuracy": 0.88},
    ],
    "methods": {
        "vanilla": {
            "lambdas": [0.0, 0.5, 1.0],
            "test_loss": [0.1, 0.9, 0.12],
            "test_accuracy": [0.9, 0.3, 0.88],
            "barrier": 0.79,
            "barrier_vs_mean": 0.79,
            "barrier_se": None,
        },
        "weight": {
            "lambdas": [0.0, 0.5, 1.0],
            "test_loss": [0.1, 0.2, 0.12],
            "test_accuracy": [0.9, 0.8, 0.88],
            "barrier": 0.09,
            "barrier_vs_mean": 0.09,
            "barrier_se": 0.01,
        },
    },
}


def _check_curve_runs(stages: list[dict], results: dict, group: str) -> list[dict]:
    """One finished curve run per method and seed pair of `results`, in `group`, whose config, rows
    (one per λ, plotted against curve/lambda) and summary are that pair's. Returns the curve runs."""
    curves = {s["name"]: s for s in stages if s["job_type"] == "curve"}
    expected = {
        f"{results['experiment']}/{method}_{pair['seeds'][0]}-{pair['seeds'][1]}": (method, pair)
        for method, summary in results["methods"].items()
        for pair in summary["pairs"]
    }
    assert sorted(curves) == sorted(expected)
    for name, (method, pair) in expected.items():
        run = curves[name]
        assert (run["group"], run["exit_code"]) == (group, 0), name
        config = {k: run["config"][k] for k in ("method", "seeds", "experiment", "model", "dataset")}
        assert config == {
            "method": method,
            "seeds": "{}-{}".format(*pair["seeds"]),
            "experiment": results["experiment"],
            "model": results["model"],
            "dataset": str(results["dataset"]),
        }
        assert run["config"]["cfg"]["seeds"] == list(results["config"]["seeds"])
        assert run["metrics"] == {"curve/lambda": "", "curve/*": "curve/lambda"}
        rows = run["rows"]
        assert [r["curve/lambda"] for r in rows] == pytest.approx(pair["lambdas"])
        assert [r["curve/test_loss"] for r in rows] == pytest.approx(pair["test_loss"])
        assert [r["curve/test_accuracy"] for r in rows] == pytest.approx(pair["test_accuracy"])
        assert run["summary"]["barrier"] == pytest.approx(pair["barrier"])
        assert run["summary"]["barrier_vs_mean"] == pytest.approx(pair["barrier_vs_mean"])
    return list(curves.values())


# -- tests -------------------------------------------------------------------------------------------


def test_offline_run_is_written(tmp_path):
    cfg = compose_config("debug=fast", f"cache_dir={tmp_path / 'endpoints'}", "logger=wandb")
    assert cfg.logger.mode == "offline"
    results = run_pipeline(cfg, tmp_path / "run")
    # one run per endpoint, one per learned method and pair, one curve per method and pair, one for the results
    learned = [m for m in cfg.matcher.methods if m.startswith("learned")]
    pairs = len(cfg.seeds) // 2
    folders = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(folders) == len(cfg.seeds) + (len(learned) + len(cfg.matcher.methods)) * pairs + 1
    for folder in folders:
        (log,) = folder.glob("run-*.wandb")
        assert log.stat().st_size > 0
    # one run per stage, all in the experiment's group, with unprefixed metric keys
    stages = _offline_runs(tmp_path / "run")
    assert {s["group"] for s in stages} == {cfg.experiment}
    assert all(s["exit_code"] == 0 for s in stages)
    jobs = [s["job_type"] for s in stages]
    assert jobs.count("train") == len(cfg.seeds) and jobs.count("evaluate") == 1
    assert jobs.count("curve") == len(cfg.matcher.methods) * pairs
    assert jobs[-1] == "evaluate"  # the curves come before the evaluate run, which stays the open one
    assert all("train_loss" in s["history"] for s in stages if s["job_type"] == "train")
    if "learned" in cfg.matcher.methods:
        assert "match" in jobs
        assert all("match_loss" in s["history"] for s in stages if s["job_type"] == "match")
    for s in stages:
        assert not [k for k in s["history"] if k.startswith(("seed_", "learned/")) or "pair_" in k], s["name"]
    (evaluate,) = [s for s in stages if s["job_type"] == "evaluate"]
    assert {"results.json", "barrier.png"} <= set(evaluate["artifacts"][f"results-{cfg.experiment}"][1])
    _check_curve_runs(stages, results, cfg.experiment)


def test_pipeline_curve_runs_group_seed_pairs_by_method(tmp_path):
    cfg = compose_config(
        "debug=fast",
        f"cache_dir={tmp_path / 'endpoints'}",
        "logger=wandb",
        "logger.group=sweep_a",
        "seeds=[0,1,2,3]",
        "matcher.methods=[vanilla,weight_perm]",
    )
    results = run_pipeline(cfg, tmp_path / "run")
    stages = _offline_runs(tmp_path / "run")
    curves = _check_curve_runs(stages, results, "sweep_a")
    assert sorted(s["name"] for s in curves) == [
        "debug/vanilla_0-1",
        "debug/vanilla_2-3",
        "debug/weight_perm_0-1",
        "debug/weight_perm_2-3",
    ]
    # grouped by config `method`, each line averages the method's two seed pairs
    by_method: dict[str, set[str]] = {}
    for s in curves:
        by_method.setdefault(s["config"]["method"], set()).add(s["config"]["seeds"])
    assert by_method == {"vanilla": {"0-1", "2-3"}, "weight_perm": {"0-1", "2-3"}}


def test_stage_runs_share_the_group_and_have_job_types(tmp_path):
    cfg = compose_config("debug=fast", "logger=wandb")
    assert cfg.logger.group == cfg.experiment == "debug"
    with Tracker(cfg, tmp_path) as tracker:
        tracker.lightning_logger("seed_0", "train")
        first = tracker.run
        assert (first.group, first.job_type, first.name) == ("debug", "train", "debug/seed_0")
        tracker.lightning_logger("vanilla_0-1", "match")
        second = tracker.run
        assert second is not first and second.id != first.id
        assert (second.group, second.job_type, second.name) == ("debug", "match", "debug/vanilla_0-1")
        import wandb

        with pytest.raises(wandb.errors.UsageError, match="finished"):
            first.log({"late": 1.0})  # the first stage was finished when the second started
        second.log({"still_open": 1.0})
    assert tracker.run is None
    assert tracker.runs == [first, second]
    stages = _offline_runs(tmp_path)
    assert [(s["group"], s["job_type"], s["exit_code"]) for s in stages] == [
        ("debug", "train", 0),
        ("debug", "match", 0),
    ]


def test_group_falls_back_to_the_experiment(tmp_path):
    cfg = compose_config("debug=fast", "logger=wandb", "logger.group=null")
    assert cfg.logger.group is None
    with Tracker(cfg, tmp_path) as tracker:
        tracker.lightning_logger("seed_3", "train")
        assert tracker.run.group == cfg.experiment == "debug"
    cfg = compose_config("debug=fast", "logger=wandb", "logger.group=sweep_a")
    with Tracker(cfg, tmp_path / "other") as tracker:
        tracker.lightning_logger("seed_3", "train")
        assert (tracker.run.group, tracker.run.name) == ("sweep_a", "debug/seed_3")


def test_match_logger_keys_have_no_prefix(tmp_path):
    from lightning.pytorch.loggers import WandbLogger

    cfg = compose_config("debug=fast", "logger=wandb")
    with Tracker(cfg, tmp_path) as tracker:
        logger = tracker.lightning_logger("learned_0-1", "match")
        assert isinstance(logger, WandbLogger) and logger.experiment is tracker.run
        logger.log_metrics({"match_loss": 0.5, "lambda": 0.25}, step=3)
        summary = dict(tracker.run.summary)
    assert summary["match_loss"] == 0.5 and summary["lambda"] == 0.25
    assert [k for k in summary if "match_loss" in k] == ["match_loss"]
    (stage,) = _offline_runs(tmp_path)
    assert {"match_loss", "lambda"} <= stage["history"]
    assert not [k for k in stage["history"] if "/" in k and not k.startswith(("trainer/", "_"))]


def test_csv_and_none_loggers(tmp_path):
    from lightning.pytorch.loggers import CSVLogger

    with Tracker(compose_config("debug=fast", "logger=csv"), tmp_path) as tracker:
        logger = tracker.lightning_logger("seed_0", "train")
        assert isinstance(logger, CSVLogger) and Path(logger.log_dir) == tmp_path / "logs" / "seed_0"
        assert tracker.log_results(RESULTS) is None and tracker.run is None
    with Tracker(compose_config("debug=fast", "logger=none"), tmp_path) as tracker:
        assert tracker.lightning_logger("seed_0", "train") is False
    assert not (tmp_path / "wandb").exists()


def test_results_are_logged_with_an_artifact(tmp_path):
    cfg = compose_config("debug=fast", "logger=wandb")
    _results_files(tmp_path)
    with Tracker(cfg, tmp_path) as tracker:
        tracker.lightning_logger("seed_0", "train")
        stage = tracker.run
        artifact = tracker.log_results(RESULTS)
        assert tracker.run is not stage and (tracker.run.job_type, tracker.run.group) == ("evaluate", "debug")
        summary = dict(tracker.run.summary)
    assert summary["vanilla/barrier"] == 0.79 and summary["weight/barrier_vs_mean"] == 0.09
    assert summary["weight/barrier_se"] == 0.01 and "vanilla/barrier_se" not in summary
    assert summary["seed_0/test_accuracy"] == 0.9 and summary["seed_1/test_loss"] == 0.12
    assert (artifact.name.split(":")[0], artifact.type) == ("results-debug", "results")
    assert {"results.json", "barrier.png"} <= set(artifact.manifest.entries)
    train, *curves, evaluate = _offline_runs(tmp_path)
    assert train["job_type"] == "train" and not train["artifacts"]
    # RESULTS holds one pair per method and no "pairs": each summary is its own curve, seeds from the config
    assert [(c["job_type"], c["name"], c["group"]) for c in curves] == [
        ("curve", "debug/vanilla_0-1", "debug"),
        ("curve", "debug/weight_0-1", "debug"),
    ]
    assert [r["curve/test_loss"] for r in curves[0]["rows"]] == [0.1, 0.9, 0.12]
    assert curves[1]["summary"]["barrier"] == 0.09 and not curves[1]["artifacts"]
    assert evaluate["job_type"] == "evaluate" and evaluate["exit_code"] == 0
    assert {"barrier_curves", "barrier_curve/loss", "barrier_curve/accuracy", "barrier_png"} <= {
        k.removesuffix("_table") for k in evaluate["history"]
    }
    kind, files = evaluate["artifacts"]["results-debug"]
    assert kind == "results" and {"results.json", "barrier.png"} <= set(files)
    assert evaluate["summary"]["vanilla/barrier"] == 0.79


def test_language_model_results_skip_accuracy(tmp_path):
    cfg = compose_config("debug=fast", "logger=wandb")
    _results_files(tmp_path)
    results = {
        "endpoints": [{"seed": 0, "test_loss": 3.1, "test_accuracy": None}],
        "methods": {
            "vanilla": {
                "lambdas": [0.0, 1.0],
                "test_loss": [3.1, 3.2],
                "test_accuracy": [None, None],
                "barrier": 0.3,
                "barrier_vs_mean": 0.2,
                "barrier_se": None,
            }
        },
    }
    with Tracker(cfg, tmp_path) as tracker:
        tracker.log_results(results)
        summary = dict(tracker.run.summary)
    assert summary["seed_0/test_loss"] == 3.1 and "seed_0/test_accuracy" not in summary
    curve, evaluate = _offline_runs(tmp_path)
    keys = {k.removesuffix("_table") for k in evaluate["history"]}
    assert "barrier_curve/loss" in keys and "barrier_curve/accuracy" not in keys
    # a curve without accuracy: its rows hold λ and the loss only
    assert curve["job_type"] == "curve" and curve["rows"] == [
        {"curve/lambda": 0.0, "curve/test_loss": 3.1},
        {"curve/lambda": 1.0, "curve/test_loss": 3.2},
    ]
    assert curve["summary"]["barrier"] == 0.3 and curve["summary"]["barrier_vs_mean"] == 0.2


def test_curve_runs_of_several_pairs(tmp_path):
    cfg = compose_config("debug=fast", "logger=wandb", "seeds=[0,1,2,3]")
    pair = lambda seeds, mid, barrier: {
        "seeds": seeds,
        "lambdas": [0.0, 0.5, 1.0],
        "test_loss": [0.1, mid, 0.12],
        "test_accuracy": [0.9, 0.5, 0.88],
        "barrier": barrier,
        "barrier_vs_mean": barrier + 0.01,
    }
    pairs = [pair([0, 1], 0.6, 0.49), pair([2, 3], 0.8, 0.69)]
    results = {
        "experiment": "debug",
        "model": "vit_tiny",
        "dataset": "digits",
        "endpoints": [],
        "methods": {"weight": {"lambdas": [0.0, 0.5, 1.0], "test_loss": [0.1, 0.7, 0.12], "pairs": pairs}},
        "config": {"seeds": [0, 1, 2, 3]},
    }
    with Tracker(cfg, tmp_path) as tracker:
        runs = tracker.log_curves(results)
        assert [(r.name, r.job_type, r.group) for r in runs] == [
            ("debug/weight_0-1", "curve", "debug"),
            ("debug/weight_2-3", "curve", "debug"),
        ]
        assert runs[0].config["seeds"] == "0-1" and runs[1].config["method"] == "weight"
        assert tracker.run is runs[-1]  # still open; the next stage finishes it
    stages = _offline_runs(tmp_path)
    _check_curve_runs(stages, results, "debug")
    assert [s["summary"]["barrier"] for s in stages] == [0.49, 0.69]
    with Tracker(compose_config("debug=fast", "logger=csv"), tmp_path / "csv") as tracker:
        assert tracker.log_curves(results) == []


def test_failed_run_still_finishes(tmp_path):
    import wandb

    cfg = compose_config("debug=fast", "logger=wandb")
    with pytest.raises(RuntimeError, match="boom"):
        with Tracker(cfg, tmp_path) as tracker:
            tracker.lightning_logger("seed_0", "train")
            run = tracker.run
            assert wandb.run is run
            raise RuntimeError("boom")
    assert wandb.run is None and tracker.run is None
    with pytest.raises(wandb.errors.UsageError, match="finished"):
        run.log({"late": 1.0})
    (stage,) = _offline_runs(tmp_path)
    assert stage["exit_code"] == 1
