"""tools/bench_vs_trl.py without TRL (test_tools_smoke.py's pattern): its default form and modes say what to install,
and hybridflow's side of it (the runner's record, ``learn --sides hybridflow``, the replay) runs on a one-step run.
The TRL side needs TRL's own environment (``--make-trl-venv``) and is not run here."""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
from tool_module import exits, run, tool, tool_process  # noqa: F401 (tool_process: autouse)


def test_bench_vs_trl_default_form_prints_usage_and_the_trl_environment(capsys):
    message, out, _ = exits("bench_vs_trl.py", [], capsys)
    assert out.startswith("usage: ") and message.startswith("choose a mode: learn, speed or replay")


@pytest.mark.parametrize("mode", ["learn", "speed", "replay"])
def test_bench_vs_trl_without_trl_says_what_to_install(mode, tmp_path, capsys):
    venv, out = tmp_path / "no-trl", tmp_path / "out"
    message, _, _ = exits("bench_vs_trl.py", [mode, "--trl-venv", str(venv), "--out", str(out)], capsys)
    assert f"{venv} does not exist, so no trl==" in message and "--make-trl-venv" in message
    assert not venv.exists(), "nothing is installed without --make-trl-venv"
    assert not any(out.rglob("model*")), "no model folder is made before TRL is found"


def test_bench_vs_trl_speed_refuses_a_baseline_tree_that_is_no_checkout(tmp_path, capsys):
    out = tmp_path / "out"
    message, _, _ = exits("bench_vs_trl.py", ["speed", "--baseline-tree", str(tmp_path), "--out", str(out)], capsys)
    assert f"--baseline-tree {tmp_path} is not a hybridflow checkout" in message and "git worktree add" in message
    assert not out.exists(), "nothing is run or made before the baseline checkout is found"


# ----------------------------------------------------------------------------- hybridflow's side of bench_vs_trl

@pytest.fixture(scope="module")
def recorded_run(tmp_path_factory):
    """A model folder made by hybridflow_runner --make-model and the record of a one-step run on it."""
    runner = tool("bench_trl/hybridflow_runner.py")
    work = tmp_path_factory.mktemp("bench_trl")
    threads = torch.get_num_threads()
    try:
        runner.main(["--make-model", str(work / "model_seed0"), "--seed", "0"])
        config = runner.RunConfig(model_dir=str(work / "model_seed0"), out=str(work / "hybridflow_seed0.json"),
                                  steps=1, prompts=2, group=2, eval_every=1)
        config.save(work / "run.config.json")
        runner.main([str(work / "run.config.json")])
    finally:
        torch.set_num_threads(threads)
    return config


@pytest.mark.xdist_group("tools-bench-trl")
def test_hybridflow_runner_records_a_run(recorded_run):
    record = json.loads(Path(recorded_run.out).read_text())
    assert record["framework"] == "hybridflow" and len(record["steps"]) == 1
    assert record["steps"][0]["grad_norm"] >= 0 and len(record["steps"][0]["prompts"]) == 2
    assert [e["step"] for e in record["evals"]] == [0, 1]
    assert all(0 <= e["greedy_accuracy"] <= 1 for e in record["evals"])


@pytest.mark.xdist_group("tools-bench-trl")
def test_hybridflow_runner_with_eval_every_0_evaluates_nothing(recorded_run, tmp_path):
    # the speed mode's setting: no greedy evaluation before, during or after the timed steps
    runner = tool("bench_trl/hybridflow_runner.py")
    config = runner.RunConfig(model_dir=recorded_run.model_dir, out=str(tmp_path / "run.json"), steps=1, prompts=2,
                              group=2, eval_every=0)
    config.save(tmp_path / "run.config.json")
    threads = torch.get_num_threads()
    try:
        runner.main([str(tmp_path / "run.config.json")])
    finally:
        torch.set_num_threads(threads)
    record = json.loads(Path(config.out).read_text())
    assert len(record["steps"]) == 1 and record["evals"] == []


@pytest.mark.xdist_group("tools-bench-trl")
def test_bench_vs_trl_learn_summarises_hybridflows_side(recorded_run, tmp_path, capsys):
    """``learn --sides hybridflow`` on a folder holding the model and the run's record (records that exist are
    reused, as after an interrupted study): the per-seed table, the summary over seeds, summary.json."""
    shutil.copytree(recorded_run.model_dir, tmp_path / "model_seed0")
    shutil.copy(recorded_run.out, tmp_path / "hybridflow_seed0.json")
    summary, out = run("bench_vs_trl.py", ["learn", "--sides", "hybridflow", "--seeds", "0", "--steps", "1", "--prompts",
                                           "2", "--group", "2", "--eval-every", "1", "--out", str(tmp_path)], capsys)
    assert "seed 0: greedy accuracy on 100 prompts" in out and "mean over 1 seeds" in out
    assert summary["totals"]["hybridflow"]["steps"] == 1
    assert json.loads((tmp_path / "summary.json").read_text())["totals"] == summary["totals"]


@pytest.mark.xdist_group("tools-bench-trl")
def test_replay_hybridflow_records_each_steps_batch_weights_and_gradient(recorded_run, tmp_path):
    from hybridflow.runtime.engines.train import TrainEngine

    update, clip = TrainEngine.update, TrainEngine._clip_gradients
    config = dataclasses.replace(recorded_run, out=str(tmp_path / "replay.json"))
    config.save(tmp_path / "replay.config.json")
    threads = torch.get_num_threads()
    tool("bench_trl/replay_hybridflow.py").main([str(tmp_path / "replay.config.json"), str(tmp_path / "dump.pt")])
    torch.set_num_threads(threads)
    (step,) = torch.load(tmp_path / "dump.pt")
    assert step["response_ids"].shape[0] == 4 and set(step["grads"]) == set(step["params"])
    assert (TrainEngine.update, TrainEngine._clip_gradients) == (update, clip), "the recording is undone"
