"""benchmarks/device_check.py without a GPU: the commands it would run (the Tiny Shakespeare one composes and
validates at paper size), its refusal where no CUDA device is visible, a part stopped at its time limit, and
the table it makes from what the parts print and write."""

from __future__ import annotations

import sys
import time

import pytest
import torch

from glmc.pipeline.validate import validate_config

from conftest import ROOT, compose_config

sys.path.insert(0, str(ROOT / "benchmarks"))
import device_check  # noqa: E402  (a script, importable once its folder is on the path)


def arguments(tmp_path, *extra: str) -> list[str]:
    return [
        "--tokenizer",
        str(tmp_path / "gpt2"),
        "--shakespeare",
        str(tmp_path / "input.txt"),
        "--out",
        str(tmp_path),
        *extra,
    ]


def test_dry_run_prints_every_part_and_the_shakespeare_run_validates(tmp_path, capsys):
    assert device_check.main(arguments(tmp_path, "--dry-run")) == 0
    printed = capsys.readouterr().out
    for name in ("inputs", "gpu tests", "step cost, digits ViT", "step cost, paper-size GPT-2", "shakespeare"):
        assert f"# {name}" in printed
    assert "-m gpu" in printed and "learned_step_cost.py --device cuda" in printed
    (line,) = [line for line in printed.splitlines() if " run.py " in line]
    overrides = [o for o in line.split(" run.py ", 1)[1].split() if not o.startswith("hydra.")]
    assert {"experiment=shakespeare_gpt2", "trainer=gpu", "seeds=[0,1,2,3]", "pairing=disjoint"} <= set(overrides)
    cfg = compose_config(*overrides)
    validate_config(cfg)
    assert cfg.data.tokenizer_path == str(tmp_path / "gpt2") and cfg.data.root == str(tmp_path / "data")
    assert (cfg.model.hidden_size, cfg.data.seq_len, cfg.train.early_stopping_patience) == (256, 256, 5)
    assert list(cfg.matcher.methods) == device_check.METHODS.split(",") and cfg.matcher.learned.max_steps == 1000
    assert not (tmp_path / "data").exists()  # a dry run writes nothing


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where no CUDA device is visible")
def test_without_cuda_it_says_so_and_fails(tmp_path, capsys):
    assert device_check.main(arguments(tmp_path)) == 2
    assert "no CUDA device" in capsys.readouterr().out


def test_a_part_that_runs_out_of_time_is_stopped_and_reported(tmp_path):
    part = device_check.Part("slow", [sys.executable, "-c", "import time; time.sleep(60)"], 0.5, tmp_path / "slow.log")
    start = time.monotonic()
    device_check.run_part(part, deadline=time.monotonic() + 100, floor=0.0)
    assert part.status.startswith("ran out of time") and time.monotonic() - start < 20
    spent = device_check.Part("late", [sys.executable, "-c", "pass"], 30, tmp_path / "late.log")
    device_check.run_part(spent, deadline=time.monotonic() + 2)  # under the 5 s floor: not started
    assert spent.status.startswith("not run") and not spent.log.exists()


def test_table_from_what_the_parts_measured(tmp_path):
    results = {
        "endpoints": [{"seed": s, "test_loss": 5.2 + s / 100, "kept": {"epoch": 7 + s}} for s in range(4)],
        "methods": {
            "vanilla": {
                "barrier": 1.3,
                "barrier_se": 0.05,
                "seconds": 0.0,
                "pairs": [{"seeds": [0, 1], "barrier": 1.25}, {"seeds": [2, 3], "barrier": 1.35}],
            },
            "learned": {
                "barrier": 0.01,
                "barrier_se": None,
                "seconds": 61.0,
                "pairs": [{"seeds": [0, 1], "barrier": 0.01}],
            },
        },
    }
    rows = device_check.shakespeare_rows(results)
    assert rows[0] == (
        "endpoint test loss (seeds 0, 1, 2, 3)",
        "5.200 / 5.210 / 5.220 / 5.230 (epochs kept: 7, 8, 9, 10)",
    )
    assert rows[1] == ("barrier, vanilla", "1.300 ± 0.050 nats; (0, 1) 1.250, (2, 3) 1.350; 0 s / pair")
    assert rows[2][1].startswith("0.010 nats; (0, 1) 0.010")
    cost = (
        "  plain training step (HF endpoint)           13.10 ms\n"
        "  learned matching step (1 lambda draws)      30.90 ms\n"
        "    projections with the solver every step  14.70 ms\n"
        "  ratio learned / plain                        2.36x  (target <= 1.5x)\n"
    )
    ((what, value),) = device_check.step_cost_rows("digits ViT", cost)
    assert value == "plain 13.10 ms, learned 30.90 ms (2.36x), projections 14.70 ms"
    summary = "...\n=============== 5 passed, 1130 deselected in 41.20s ===============\n"
    assert device_check.pytest_rows(summary) == [("`pytest -m gpu`", "5 passed, 1130 deselected")]
    part = device_check.Part("gpu tests", [], 75, tmp_path / "gpu.log", status="ok", seconds=42.0, rows=[("x", "y")])
    late = device_check.Part("shakespeare", [], 300, tmp_path / "s.log", status="ran out of time after 300 s")
    late.log.write_text("line one\nEpoch 12: loss 5.1\n")
    args = device_check.parse(arguments(tmp_path))
    device_check.collect(late, args)
    text = device_check.table([part, late], "NVIDIA H100 80GB HBM3", args, 350.0)
    assert text.startswith("Device check on one NVIDIA H100 80GB HBM3")
    assert "| gpu tests | ok | 42 | x | y |" in text
    assert (
        "| shakespeare | ran out of time after 300 s | 0 | output's last lines | `line one | Epoch 12: loss 5.1` |"
        in text
    )
