"""tools/gpu_check.py: its checks run on the CPU here (gloo for NCCL), and on a GPU where one is present.

On the CPU the figures mean nothing; what is checked is what the program decided: every check ran
to its end, the FSDP2 engine's update equals the plain engine's, and the weight sync left the rollout
engine's weights equal to the actor's. The ``gpu`` tests run each check on ``cuda:0`` with the 10m
bench model and are skipped where torch sees no CUDA device.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tool_module import load_file

TOOL = Path(__file__).resolve().parents[2] / "tools" / "gpu_check.py"
SMALL = ["--steps", "1", "--prompts", "2", "--n", "2", "--tokens", "4", "--micro", "2"]


@pytest.fixture
def gpu_check():
    threads = torch.get_num_threads()
    yield load_file(TOOL, "gpu_check_under_test")
    torch.set_num_threads(threads)


def rows_of(gpu_check, argv, tmp_path) -> tuple[int, dict]:
    out = tmp_path / "rows.json"
    code = gpu_check.main(argv + ["--out", str(out)])
    return code, {r["check"]: r for r in json.loads(out.read_text())}


def test_the_checks_run_on_the_cpu(gpu_check, tmp_path, capsys):
    checks = ["env", "train-engine", "fsdp2", "nccl", "weight-sync", "grpo", "packing", "lora"]
    code, rows = rows_of(gpu_check, ["--device", "cpu", "--size", "tiny", *SMALL, "--only", *checks], tmp_path)
    assert code == 0 and list(rows) == checks and all(r["status"] == "ok" for r in rows.values()), rows
    assert rows["fsdp2"]["metric_vs_plain_max_abs"] < 1e-5  # fp32 on the CPU: one rank's FSDP2 step is the plain step
    assert float(rows["fsdp2"]["weights_vs_plain_max_abs"]) < 1e-6
    sync = rows["weight-sync"]
    assert sync["rollout_vs_train_max_abs"] == 0.0 and sync["sync_mb"] > 0 and sync["buckets"] >= 1
    assert rows["grpo"]["steps"] == 2 and rows["grpo"]["devices"] == ["cpu"]
    assert float(rows["packing"]["fp32_logprob_packed_vs_padded_max_abs"]) < 1e-5
    assert 0 < rows["lora"]["lora_sync_mb"] < rows["lora"]["full_sync_mb"]  # adapters only
    table = capsys.readouterr().out
    assert "| check | status | figures |" in table and "| fsdp2 | ok |" in table


def test_a_failing_check_is_a_row_and_the_exit_status(gpu_check, tmp_path, capsys):
    code, rows = rows_of(gpu_check, ["--device", "cpu", "--size", "no-such-size", "--only", "train-engine", "nccl"],
                         tmp_path)
    assert code == 1
    assert rows["train-engine"]["status"] == "FAILED" and "no-such-size" in rows["train-engine"]["error"]
    assert rows["nccl"]["status"] == "ok"  # the next check still ran


def test_without_cuda_it_says_so(gpu_check, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    assert gpu_check.main([]) == 2
    assert "no CUDA device" in capsys.readouterr().out


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("check", ["train-engine", "fsdp2", "nccl", "weight-sync", "grpo", "ppo", "packing", "lora"])
def test_each_check_on_cuda(gpu_check, tmp_path, check):
    code, rows = rows_of(gpu_check, ["--size", "10m", "--steps", "1", "--prompts", "8", "--n", "4", "--tokens", "16",
                                     "--only", check], tmp_path)
    assert code == 0 and rows[check]["status"] == "ok", rows
