"""Every script in tools/: ``--help`` prints its usage, and its cheapest real invocation runs and prints its figures.

Each tool's ``main(argv)`` is called in this process (torch, transformers and hybridflow are imported
once); a subprocess only where the tool itself starts one (bench_learning's runs, bench_logprob's
measuring workers) or is not Python (ensure_graphviz.sh). Sizes, steps and rounds are the smallest
the flags allow, and each test checks what the tool printed or wrote, never how long it took.

Not run for real here, and why (each still gets ``--help``):

* The Ray benchmarks (bench_async, bench_checkpoint, bench_dispatch, bench_overlap, bench_warm_workers, bench_weight_sync, bench_streaming's
  default, bench_placements' Ray rows, and bench_learning's stale runs, ``--staleness K``): a Ray instance and its worker processes, each importing torch, cost
  ~85 s of CPU for bench_overlap's smallest run on 2 cores, several times this file's budget. Their
  set-up before Ray (the plans of the default form compile and bind on this machine: where three of
  them used to fail) is run instead.
* bench_neighbour: every measurement is a fresh Python process training GRPO (~6 s of CPU to import
  and set up) beside a busy-loop process, and the smallest comparison takes two of them and the
  loop: ~18 s of CPU, more than half of this file's budget.
* bench_agent_calc: each seed is a learning run of examples/agent_calc (minutes).
* bench_rollout, bench_vs_trl's TRL side (speed, replay, trl_runner, replay_trl): they need vLLM or
  TRL, which live in environments of their own; here they must say what to install (bench_vs_trl's tests,
  and those of hybridflow's side of it, are in test_bench_vs_trl_smoke.py).

tools/generated_page.py and tools/bench_trl/{common,parity,speed_table,trl_venv}.py are modules the scripts
import, with no command line: they are only imported.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import re
import shutil
import subprocess

import pytest
import torch
from tool_module import TOOLS, exits, run, tool, tool_process  # noqa: F401 (tool_process: autouse)

SCRIPTS = (
    "bench_agent_calc.py", "bench_agent_rollout.py", "bench_async.py", "sandbox_faults.py",
    "bench_bytecode.py", "bench_checkpoint.py", "bench_contracts.py", "bench_hashes.py", "compare_verl_corrections.py", "count_step_files.py", "bench_dispatch.py", "bench_learning.py", "bench_logprob.py",
    "bench_neighbour.py", "bench_overhead.py", "bench_overlap.py", "bench_placement.py", "bench_placements.py",
    "bench_predicted.py", "bench_rollout.py", "bench_scale.py", "bench_rollout_decode.py", "bench_roofline.py", "bench_streaming.py", "bench_vs_trl.py", "bench_weight_sync.py",
    "gen_config_docs.py", "gen_operator_docs.py", "gpu_check.py", "bench_trl/hybridflow_runner.py", "bench_trl/replay_hybridflow.py",
    "bench_trl/replay_trl.py", "bench_trl/trl_runner.py",
    "bench_calibration.py", "bench_warm_workers.py", "bench_grad_memory.py",
)
"""The Python scripts with a command line: ``main(argv)``."""
MODULES = ("generated_page.py", "bench_trl/common.py", "bench_trl/flops.py", "bench_trl/parity.py",
           "bench_trl/speed_table.py", "bench_trl/trl_venv.py")
"""Modules the scripts import: no command line of their own."""
SHELL = ("ensure_graphviz.sh",)


# ----------------------------------------------------------------------------- every script

def test_every_file_in_tools_is_covered():
    found = {str(p.relative_to(TOOLS)) for p in TOOLS.rglob("*") if p.suffix in (".py", ".sh")}
    assert found == set(SCRIPTS) | set(MODULES) | set(SHELL), "a new tool needs its smoke test here"


@pytest.mark.parametrize("path", SCRIPTS)
def test_help_prints_the_usage(path, capsys):
    code, out, _ = exits(path, ["--help"], capsys)
    assert code == 0 and out.startswith("usage: ") and "-h, --help" in out


@pytest.mark.parametrize("path", MODULES)
def test_imported_modules_have_no_command_line(path):
    """These are libraries of the scripts (loading one runs nothing); the scripts' tests exercise them."""
    assert "__main__" not in (TOOLS / path).read_text()
    assert tool(path).__doc__


@pytest.mark.parametrize("path", ["bench_trl/hybridflow_runner.py", "bench_trl/replay_hybridflow.py",
                                  "bench_trl/replay_trl.py", "bench_trl/trl_runner.py"])
def test_runners_without_arguments_print_their_usage(path, capsys):
    code, _, err = exits(path, [], capsys)
    assert code == 2 and err.startswith("usage: ") and "error:" in err


# ----------------------------------------------------------------------------- in-process runs

def test_sandbox_faults_prints_the_limit_of_each_case(capsys):
    _, out = run("sandbox_faults.py", ["--cases", "fork bomb", "huge output", "well-behaved"], capsys)
    assert re.search(r"fork bomb\s+processes", out) and re.search(r"huge output\s+output", out)
    assert re.search(r"well-behaved\s+None", out) and "all 3 at once" in out


def test_bench_agent_rollout_compares_the_agent_loop_with_one_turn(capsys):
    _, out = run("bench_agent_rollout.py", ["--prompts", "2", "--turns", "2", "--tokens-per-turn", "3", "--repeats", "1"],
                 capsys)
    assert "single-turn  12 model tokens" in out and "agent loop   12 model tokens" in out
    assert "agent loop / single-turn throughput" in out


def test_bench_hashes_times_steps_with_and_without_hashes(capsys):
    _, out = run("bench_hashes.py", ["rollout_batch_size=4", "n_samples=2", "batch_size=8", "--steps", "4", "--warmup", "1", "--json"],
                 capsys)
    figures = json.loads(out.strip().splitlines()[-1])
    # 4 counted steps interleaved on, off, off, on: two of each; every node output's tensors hashed per step
    assert figures["steps_each"] == 2 and figures["lines_per_step"] >= 10 and figures["record_s"] > 0


def test_bench_bytecode_times_imports_from_source_and_from_bytecode(capsys):
    result, out = run("bench_bytecode.py", ["--rounds", "1", "--modules", "hybridflow.errors", "--json"], capsys)
    assert json.loads(out) == result
    assert result["processes_each"] == 2 and result["modules"] == ["hybridflow.errors"]
    assert result["source_s"] > 0 and result["bytecode_s"] > 0


def test_bench_placement_searches_a_small_cluster(capsys):
    code, out = run("bench_placement.py", ["--model", "llama2-7b", "--gpus", "8"], capsys)
    assert code == 0
    assert re.search(r"^llama2-7b PPO on 8 x a100-80g, engine fsdp: search [\d.]+ s wall, [\d.]+ s CPU; "
                     r"iteration [\d.]+ s$", out, re.M), out
    for strategy in ("colocate", "split", "standalone"):
        assert re.search(rf"^  {strategy} +[\d.]+ s$", out, re.M), out


def test_compare_verl_corrections_says_when_verl_does_not_import(tmp_path, capsys):
    """Without a verl checkout (none is installed here: it is a peer, compared in a side environment) the tool
    says that verl's modules do not import and exits 2, before comparing anything."""
    assert tool("compare_verl_corrections.py").main(["--verl", str(tmp_path), "--seeds", "1"]) == 2
    assert "verl's modules do not import here: ModuleNotFoundError" in capsys.readouterr().err


def test_count_step_files_lists_the_files_of_one_step(capsys):
    code, out = run("count_step_files.py", [], capsys)
    files = [line.split()[0] for line in out.splitlines() if line.startswith("hybridflow/")]
    total, path = map(int, re.search(r"^(\d+) hybridflow/ files crossed by one training step; (\d+) on the path",
                                     out, re.M).groups())
    assert code == 0 and total == len(files) and path == len([f for f in files if "/engines/" not in f])
    # the step goes from the trainer through the interpreter to the one worker class, and no further than an engine
    assert {"hybridflow/trainer/trainer.py", "hybridflow/runtime/interpreter.py", "hybridflow/runtime/worker.py",
            "hybridflow/runtime/local.py"} <= set(files)
    assert not any(f.startswith(("hybridflow/compiler/", "hybridflow/cli.py")) for f in files)
    # the longest call chain runs from the command line through the same corridor to an op of hybridflow_ops
    chain = re.search(r"the longest crosses (\d+) hybridflow/ files to reach its op:\n((?:  .*\n?)+)", out)
    hops = [line.strip().removeprefix("-> ") for line in chain.group(2).splitlines()]
    assert hops[0] == "hybridflow/cli.py" and hops[-1].startswith("hybridflow_ops/") and int(chain.group(1)) == len(hops) - 1
    assert hops.index("hybridflow/runtime/interpreter.py") < hops.index("hybridflow/runtime/worker.py")


def test_bench_rollout_decode_compares_both_paths(capsys):
    result, out = run("bench_rollout_decode.py", ["--rounds", "1", "--prompts", "2", "--group", "2",
                                                  "--new-tokens", "2", "--json"], capsys)
    assert json.loads(out) == result
    assert result["same_tokens"] and result["rows"] == 4
    assert all(result[clock][f"{side}_ms"] > 0 for clock in ("wall", "cpu") for side in ("hf", "lean"))


def test_bench_rollout_decode_spread_lengths_count_the_row_steps(capsys):
    result, _ = run("bench_rollout_decode.py", ["--rounds", "1", "--prompts", "2", "--group", "4", "--new-tokens", "8",
                                                "--spread", "--json"], capsys)
    assert result["same_tokens"] and result["spread"] and 0 < result["response_len"] <= 8
    assert result["lean_row_steps"] <= result["hf_row_steps"] == result["row_steps_all_rows"]


def test_bench_roofline_sums_the_products_of_the_rows_still_going(capsys):
    result, out = run("bench_roofline.py", ["--size", "tiny", "--new-tokens", "4", "--prompts", "2", "--group", "2",
                                            "--batches", "3", "--repeats", "1", "--trl-step", "0.05"], capsys)
    assert result["rows"] == 4 and 1 <= result["mean_response_len"] <= 4
    assert 0 < result["row_steps"] <= 4 * 3  # no row is fed more than its tokens after the first
    assert result["update_tokens"] == 2 * 5 + round(4 * result["mean_response_len"])
    assert result["decode_s"] > 0 and result["update_s"] > result["update_backward_s"] > 0
    assert "2x TRL's 0.050 s is 0.025 s a step" in out


def test_bench_grad_memory_measures_both_sides_each_in_a_fresh_process(capsys):
    # a 50,000-token vocabulary at hidden 256: each dense embedding gradient is 51 MB, and autograd holds the
    # responses' one while the prompts' one is made; the buffers side makes none
    result, out = run("bench_grad_memory.py", ["--vocab", "50000", "--hidden", "256", "--layers", "1", "--heads", "4",
                                               "--kv-heads", "2", "--prompts", "2", "--group", "2", "--prompt-len", "32",
                                               "--response-len", "4"], capsys)
    assert set(result) == {"autograd", "buffers", "rise_ratio"} and "rise over the step, buffers / autograd" in out
    assert result["autograd"]["rise_mb"] >= result["buffers"]["rise_mb"] + 40


def test_bench_overhead_runs_one_pair_of_the_same_steps(capsys):
    results, out = run("bench_overhead.py", ["--pairs", "1", "--warmup", "0", "--skip", "on", "--prompts", "2",
                                             "--group", "2", "--new-tokens", "2", "--json"], capsys)
    assert json.loads(out) == results
    (result,) = results
    assert result["skip_rows"] and result["same_rollout_lengths"] == 1, "both sides sample the same responses"
    assert result["cpu"]["ours_ms"] > 0 and result["cpu"]["hand_ms"] > 0


def test_bench_contracts_times_one_round_and_unwraps_the_checks(capsys):
    from hybridflow.runtime import contracts

    checks = contracts.check_node_output, contracts.check_compute_results
    _, out = run("bench_contracts.py", ["--rounds", "1", "--json"], capsys)
    figures = json.loads(out)
    assert figures["steps_on"] == 2 and figures["steps_off"] == 2  # one round: on, off, off, on
    assert figures["inside_checks_ms_per_step"] > 0 and figures["median_step_off_s"] > 0
    assert (contracts.check_node_output, contracts.check_compute_results) == checks
    assert contracts.enabled()


@pytest.mark.parametrize("path, title", [("gen_config_docs.py", "# Configuration reference"),
                                         ("gen_operator_docs.py", "# RL operators")])
def test_page_generators_write_their_page(path, title, tmp_path, capsys):
    page = tmp_path / "page.md"
    code, _ = run(path, ["--output", str(page)], capsys)
    assert code == 0 and page.read_text().startswith(title)
    assert page.read_text() == tool(path).render()


def test_bench_placements_trains_a_local_placement(capsys):
    _, out = run("bench_placements.py", ["--only", "local", "--placement", "colocate", "--steps", "2",
                                         "rollout_batch_size=2", "n_samples=2", "batch_size=4"], capsys)
    row = re.search(r"^local +colocate +([\d.]+) +([\d.]+) +([\d.]+)  pool0\[1\]: actor\+critic\+ref", out, re.M)
    assert row, out
    assert float(row.group(1)) > 0 and float(row.group(2)) > 0


def test_bench_predicted_prints_predicted_against_measured(capsys):
    _, out = run("bench_predicted.py", ["--only", "grpo", "--steps", "2", "rollout_batch_size=2", "n_samples=2"],
                 capsys)
    assert "== grpo: 2 steps in" in out
    assert re.search(r"^actor\.update +[\d.]+ +[\d.]+ +[\d.]+$", out, re.M), out
    assert re.search(r"^  grpo +[\d.]+ s vs [\d.]+ s  ratio [\d.]+", out, re.M), out


# ----------------------------------------------------------------------------- tools that start processes

def test_bench_learning_runs_one_recipe_step(tmp_path, capsys):
    report = tmp_path / "results.json"
    code, out = run("bench_learning.py", ["--algo", "grpo", "--seeds", "0", "--steps", "1",
                                          "--out", str(tmp_path / "runs"), "--json", str(report)], capsys)
    (result,) = json.loads(report.read_text())
    assert code == 0 and "error" not in result, result
    assert result["algo"] == "grpo" and result["steps"] == 1
    assert [step for step, _, _ in result["curve"]] == [0, 1] and 0 <= result["final"] <= 1
    assert "summary grpo: reached 0.5 on" in out
    # on-policy, one mini-batch, one epoch: the ratio to the rollout's own log-probs is 1, nothing is clipped
    assert result["correction"] == {"clipped_token_frac": 0.0, "max_step_clipped_frac": 0.0, "staleness": 0.0}


def test_bench_learning_share_clipped_weighs_steps_by_their_tokens(tmp_path):
    """Two steps of 512 responses: 10 % of 2.0 tokens each clipped, then 40 % of 1.0: (0.1*2 + 0.4*1) / 3 = 0.2 of
    the tokens; the validation record (no clip metric) and the mean lag (2 and 4 updates: 3) as written."""
    metrics = tmp_path / "metrics.jsonl"
    records = [{"step": 0, "val/score/greedy": 0.1},
               {"step": 1, "actor/pg_clipfrac": 0.1, "response_length/mean": 2.0, "rollout/staleness": 2.0},
               {"step": 2, "actor/pg_clipfrac": 0.4, "response_length/mean": 1.0, "rollout/staleness": 4.0}]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert tool("bench_learning.py").correction_of(metrics) == {"clipped_token_frac": 0.2, "max_step_clipped_frac": 0.4,
                                                                "staleness": 3.0}
    # an IS-weighted correction's weights (grpo_is): their mean over the steps, beside the clip's share
    records[1]["truncated_is_weight/is_weights/mean"], records[2]["truncated_is_weight/is_weights/mean"] = 0.75, 0.95
    metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert tool("bench_learning.py").correction_of(metrics)["mean_is_weight"] == 0.85


def test_bench_learning_stale_runs_go_to_ray(tmp_path, capsys):
    """A stale run's recipe command carries k and the executor; k >= 1 on the local executor is refused (a usage
    error) before any run starts."""
    cmd = tool("bench_learning.py").command("grpo", 3, tmp_path, None, None, staleness=4, executor="ray")
    assert cmd[cmd.index("--staleness") + 1] == "4" and cmd[cmd.index("--executor") + 1] == "ray"
    code, _, err = exits("bench_learning.py", ["--algo", "grpo", "--staleness", "2", "--executor", "local",
                                               "--out", str(tmp_path)], capsys)
    assert code == 2 and "add --executor ray" in err and not (tmp_path / "grpo@k2_seed0").exists()


def test_bench_logprob_measures_both_variants(capsys):
    """The smallest sizes whose phases still raise the workers' peak memory (each variant a fresh process)."""
    code, out = run("bench_logprob.py", ["--n", "256", "--vocab", "2048", "--hidden", "32", "--chunk-size", "64",
                                         "--repeats", "1"], capsys)
    assert code == 0
    assert out.startswith("B*T=256 V=2048 hidden=32 chunk_size=64 float32 threads=1 repeats=1")
    for phase in ("fwd", "bwd"):
        assert re.search(rf"^{phase} time +[\d.]+ s +[\d.]+ s +[\d.]+  <= 1.3 (ok|MISSED)$", out, re.M), out
        assert re.search(rf"^{phase} mem +[\d.]+ MB +[\d.]+ MB +([\d.]+|nan)  <= 0.25 (ok|MISSED)$", out, re.M), out


def test_ensure_graphviz_help():
    usage = subprocess.run(["sh", str(TOOLS / "ensure_graphviz.sh"), "--help"], capture_output=True, text=True)
    assert usage.returncode == 0 and usage.stdout.startswith("usage: ")


@pytest.mark.parametrize("dot", [True, False], ids=["dot-present", "dot-missing"])
def test_ensure_graphviz(dot, tmp_path):
    """On a PATH of its own, so that it never installs anything here: silent when a ``dot`` is on the PATH,
    else it says how to install Graphviz."""
    if dot:
        (tmp_path / "dot").write_text("#!/bin/sh\n")
        (tmp_path / "dot").chmod(0o755)
    done = subprocess.run([shutil.which("sh"), str(TOOLS / "ensure_graphviz.sh")], capture_output=True, text=True,
                          env={"PATH": str(tmp_path)})
    assert done.returncode == 0
    assert (done.stderr == "") if dot else ("install it with: sudo apt-get install graphviz" in done.stderr)


# ----------------------------------------------------------------------------- peers that live elsewhere

def test_bench_rollout_says_how_to_get_vllm(capsys):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is importable here: the default form would start it (tens of seconds)")
    message, _, _ = exits("bench_rollout.py", [], capsys)
    assert "make vllm-env" in message and ".venv-vllm/bin/python tools/bench_rollout.py" in message


# ----------------------------------------------------------------------------- the Ray benchmarks, up to Ray

def test_bench_overlap_default_plans_fit_this_machine():
    """Both plans of the default form (staleness 0 and 1) compile for its model and bind to the Ray CPU slots;
    they compiled for a 0.5B preset before, which no CPU slot of a small machine holds."""
    bench = tool("bench_overlap.py")
    args = bench.parse_args([])
    _, batches, plans = bench.workload(args)
    assert len(batches) == args.warmup + args.steps + 1
    for staleness, plan in plans.items():
        assert plan.staleness == staleness and plan.machine.startswith("ray: 2 CPU slots")
        assert plan.placement("actor").generation_pool


def test_bench_async_default_plans_fit_this_machine(capsys):
    """The plan of every k of the default form (0, 1, 2, 4) compiles for its model and binds to the Ray CPU slots,
    generation on a pool of its own working k steps ahead; each k >= 1 runs with each weight sync (--sync both), or
    with the one asked for; the report prints a row per (k, sync), predicted beside measured."""
    bench = tool("bench_async.py")
    args = bench.parse_args([])
    _, batches, plans = bench.workload(args)
    assert sorted(plans) == [0, 1, 2, 4] and len(batches) == args.warmup + args.steps + 4
    for k, plan in plans.items():
        assert plan.staleness == k and plan.machine.startswith("ray: 2 CPU slots")
        assert plan.placement("actor").generation_pool
        assert {op.iteration_offset for op in plan.ops if op.node == "actor.generate"} == {k}
    pairs = [(0, "collective")] + [(k, sync) for k in (1, 2, 4) for sync in ("collective", "staged")]
    assert bench.configs(args) == pairs
    assert bench.configs(bench.parse_args(["--sync", "staged", "--ks", "0", "2"])) == [(0, "collective"), (2, "staged")]
    # the report of made-up figures: g = t = 1 s, no sync: ideal 2x, predicted 2x for every k >= 1 and either sync
    ratios = bench.report({c: [10.0 * (1 + c[0])] for c in pairs}, {c: [1.0 + c[0]] for c in pairs}, [1.0, 1.0], 1.0,
                          0.0, args)
    out = capsys.readouterr().out
    assert ratios == {c: 1.0 + c[0] for c in pairs} and "= 2.00x" in out
    rows = [line.split() for line in out.splitlines() if line.split() and line.split()[0] in ("0", "1", "2", "4")]
    assert [row[:2] for row in rows] == [[str(k), sync] for k, sync in pairs]
    assert [row[-1] for row in rows] == ["1.00x"] + ["2.00x"] * 6  # predicted beside measured
    # generation times that vary (0.2 s and 1.8 s in turn, t = 1 s): the staged sync's prediction rises with k,
    # the collective one's does not (the pools move in lock step)
    bench.report({c: [1.0] for c in pairs}, {c: [1.0] for c in pairs}, [0.2, 1.8], 1.0, 0.0, args)
    rows = {(row[0], row[1]): float(row[-1][:-1]) for row in (line.split() for line in capsys.readouterr().out.splitlines())
            if len(row) == 6 and row[0] in ("1", "2", "4")}
    assert rows["1", "collective"] == rows["4", "collective"] < rows["4", "staged"]
    assert rows["1", "staged"] < rows["2", "staged"] <= rows["4", "staged"]


def test_bench_dispatch_plan_binds():
    plan = tool("bench_dispatch.py").one_op_plan()
    assert plan.machine and [r.role for r in plan.placements] == ["reward"]


def test_bench_weight_sync_default_plans_bind():
    bench = tool("bench_weight_sync.py")
    _, _, plans = bench.setup(bench.parse_args([]))
    assert set(plans) == set(bench.CASES) and all(p.machine.startswith("ray: 2 CPU slots") for p in plans.values())
    sharded = plans["hybrid engine, dp=2 (FSDP2)"]
    assert len(sharded.pool(sharded.placement("actor").pool).devices) == 2


def test_bench_checkpoint_default_plan_binds(tmp_path):
    bench = tool("bench_checkpoint.py")
    plan, specs = bench.setup(bench.parse_args([]), tmp_path)
    assert plan.machine.startswith("ray: 2 CPU slots") and (tmp_path / "model" / "config.json").exists()
    assert specs["actor"].model == str(tmp_path / "model")


def test_bench_scale_runs_the_baseline_and_names_what_this_checkout_lacks(capsys, tmp_path):
    results, out = run("bench_scale.py", ["--size", "tiny", "--steps", "1", "--prompts", "2", "--n", "2", "--tokens", "4",
                                          "--micro", "2", "--threads", "1", "--variants", "lora+packed+budget",
                                          "--work", str(tmp_path)], capsys)
    (full,) = results["full"]
    assert full["steps"] == 2 and full["peak_mb"] > 0 and full["step_s"] > 0, full
    assert re.search(r"^full +[\d.]+ +[\d.]+ +[\d.]+ +\d+ +[\d.]+ +[\d.]+ +1\.00  1\.00  1\.00$", out, re.M), out
    from hybridflow import PPOConfig

    for name, runs in results.items():  # every variant ran, or says which config fields this checkout lacks
        fields = tool("bench_scale.py").variants(argparse.Namespace(micro=2, tokens=4, lora_rank=16))[name]
        lacking = [f for f in fields if f not in PPOConfig.model_fields]
        assert isinstance(runs[0], str) == bool(lacking), (name, runs)
