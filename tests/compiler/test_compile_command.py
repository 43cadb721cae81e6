"""`hybridflow compile` and `hybridflow simulate`: outputs, files, and errors as messages with exit code 1."""
from __future__ import annotations

import json
import re

import pytest

from hybridflow.algorithms import ALGORITHMS
from hybridflow.cli import main
from hybridflow.compiler.plan import ExecutionPlan, verify_plan


def test_compile_writes_a_verified_plan_and_prints_the_search_time(tmp_path, capsys):
    out = tmp_path / "plans" / "ppo.json"
    assert main(["compile", "ppo", "--cluster", "a100-80g:2", "--model", "actor=llama2-7b", "reward=llama2-13b",
                 "-o", str(out), "--debug", "--dump-ir", str(tmp_path / "ir")]) == 0
    printed = capsys.readouterr().out
    assert re.search(r"placement search took \d+\.\d\d s", printed)
    assert "placement auto: predicted iteration" in printed and "scheduled candidates:" in printed
    plan = ExecutionPlan.from_json(out.read_text())
    verify_plan(plan)
    assert plan.strategy == "auto" and plan.cluster == "a100-80g:2"
    assert len(list((tmp_path / "ir").iterdir())) == 6 * 8  # six passes for each of the eight scheduled candidates


def test_compile_fixed_manual_and_graph_files(tmp_path, capsys):
    graph = tmp_path / "remax.json"
    graph.write_text(ALGORITHMS["remax"].build().to_json())
    assert main(["compile", str(graph), "--cluster", "h100-80g:1", "--model", "qwen2.5-7b", "--placement", "colocate",
                 "--prompts", "256", "--text", "-o", str(tmp_path / "r.json")]) == 0
    printed = capsys.readouterr().out
    assert "placement colocate" in printed and "op actor.generate_greedy:" in printed
    assert main(["compile", "ppo", "--set", "kl_coef=0.01", "--cluster", "a100-80g:2", "--model", "actor=llama2-7b",
                 "--placement", "actor+ref@8;critic+reward@4;actor.generate@4", "-o", str(tmp_path / "s.json")]) == 0
    assert "pool2 (4 devices): actor generate dp1·tp4·pp1" in capsys.readouterr().out


def test_compile_errors_are_messages(tmp_path, capsys):
    cases = [
        (["compile", "ppo", "--cluster", "a100-80g:2"], "give the models"),
        (["compile", "ppo", "--model", "actor=llama9"], "unknown model preset"),
        (["compile", "ppo", "--model", "actor=llama2-7b", "--cluster", "tpu:2"], "unknown cluster preset"),
        (["compile", "ppo", "--model", "actor=llama2-7b", "--placement", "colocate", "--staleness", "1"], "pool of its own"),
        (["compile", "nope", "--model", "actor=llama2-7b"], "unknown algorithm 'nope'"),
        (["compile", "ppo", "--model", "actor=llama2-70b", "--cluster", "a100-80g:1"], "no placement"),
        (["compile", "ppo", "--model", "actor=llama2-7b", "--prompts", "0"], "prompts"),
    ]
    for argv, message in cases:
        assert main(argv + ["-o", str(tmp_path / "x.json")]) == 1, argv
        assert message in capsys.readouterr().err, argv


def test_simulate_prints_one_row_per_model_and_size(capsys):
    assert main(["simulate", "ppo", "--models", "llama2-7b,llama2-13b", "--gpus", "8,16", "--prompts", "256"]) == 0
    printed = capsys.readouterr().out
    rows = [line for line in printed.splitlines() if re.match(r"llama2-(7|13)b\s+(8|16)\s", line)]
    assert len(rows) == 4
    for row in rows:
        colocate, split, standalone, auto = (float("inf") if c == "OOM" else float(c) for c in row.split()[2:6])
        assert auto <= min(colocate, split, standalone)
    assert "llama2-7b on 16 GPUs: pool 0" in printed
    assert main(["simulate", "grpo", "--models", "qwen2.5-7b", "--model", "reward=rule", "--gpus", "8", "--brief"]) == 0
    assert "automatic placements" not in capsys.readouterr().out
    assert main(["simulate", "ppo", "--gpus", "12"]) == 1
    assert "neither whole nodes" in capsys.readouterr().err


def test_simulate_engine_workload_network_and_compare(capsys):
    argv = ["simulate", "ppo", "--models", "llama2-13b", "--gpus", "16", "--engine", "megatron", "--workload", "paper",
            "--network", "paper", "--compare", "paper", "--brief"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "8 optimizer steps (workload paper)" in printed and "network paper, engine megatron" in printed
    row = next(line for line in printed.splitlines() if line.startswith("llama2-13b"))
    winner, margin, paper = row.split()[6:9]
    assert winner in ("colocate", "split", "standalone") and margin.endswith("%") and paper.startswith("colocate")
    assert "winner agrees with paper in" in printed
    for bad, message in ((["--engine", "deepspeed"], "training engines"), (["--workload", "mine"], "workload preset"),
                         (["--network", "slow"], "network preset"), (["--compare", "verl"], "known studies")):
        assert main(["simulate", "ppo", "--models", "llama2-7b", "--gpus", "8", "--brief"] + bad) == 1
        assert message in capsys.readouterr().err, bad


def test_compile_validates_a_graph_file_as_the_dsl_does(tmp_path, capsys):
    doc = json.loads(ALGORITHMS["grpo"].build().to_json())
    node = next(n for n in doc["nodes"] if n["kind"] == "compute")
    node["role"] = "ghost"
    path = tmp_path / "ghost.json"
    path.write_text(json.dumps(doc))
    assert main(["compile", str(path), "-o", str(tmp_path / "plan.json")]) == 1
    assert f"node {node['name']!r}" in capsys.readouterr().err


def test_simulate_assumptions_and_strong_scaling(capsys):
    argv = ["simulate", "ppo", "--models", "llama2-7b", "--gpus", "8,16", "--brief"]
    assert main(argv) == 0
    plain = capsys.readouterr().out
    assert main(argv + ["--assume", "decode_step_overhead_s=0.01"]) == 0
    slower = capsys.readouterr().out
    assert "assuming decode_step_overhead_s=0.01" in slower and "assuming" not in plain

    def auto(text, gpus):
        return float(next(l for l in text.splitlines() if l.startswith("llama2-7b") and int(l.split()[1]) == gpus).split()[5])

    # 1024 decode steps of 10 ms more, in at least one wave
    assert auto(slower, 16) >= auto(plain, 16) + 10.24 - 1e-6
    line = next(l for l in plain.splitlines() if "llama2-7b 8->16 GPUs" in l)
    # efficiency = T8·8 / (T16·16), from the table's rounded seconds
    printed = float(line.rsplit("efficiency ", 1)[1].rstrip("%"))
    assert abs(printed - 100 * auto(plain, 8) * 8 / (auto(plain, 16) * 16)) < 0.1 and "strong scaling" in plain


def test_compile_engine_flag_records_the_training_engine(tmp_path, capsys):
    out = tmp_path / "plan.json"
    argv = ["compile", "ppo", "--cluster", "a100-80g:4", "--model", "actor=llama2-7b", "reward=rule", "-o", str(out)]
    assert main(argv + ["--engine", "megatron"]) == 0
    plan = ExecutionPlan.from_json(out.read_text())
    verify_plan(plan)
    trained = {p.role: p.train_engine for p in plan.placements if p.role in ("actor", "critic")}
    assert trained == {"actor": "megatron", "critic": "megatron"}
    assert main(argv) == 0  # the default is the engine the runtime executes
    plan = ExecutionPlan.from_json(out.read_text())
    assert {p.train_engine for p in plan.placements} == {"fsdp"}
    capsys.readouterr()
    assert main(argv + ["--engine", "deepspeed"]) == 1
    assert "choose from fsdp, megatron" in capsys.readouterr().err


def test_compile_refuses_uncorrected_staleness_and_prints_the_lags(tmp_path, capsys):
    argv = ["--model", "actor=qwen2.5-7b", "reward=rule", "--cluster", "a100-80g:2", "--placement", "split",
            "--staleness", "1"]
    assert main(["compile", "grpo", *argv, "-o", str(tmp_path / "g.json")]) == 1
    err = capsys.readouterr().err
    assert "node 'actor.update' field 'advantages': loss ppo_clip trains on lagged data" in err
    assert "grpo_advantage.advantages -> actor.update has lag 1" in err and "truncated_is_weight (compute" in err
    assert not (tmp_path / "g.json").exists()
    assert main(["compile", "grpo_is", *argv, "-o", str(tmp_path / "gis.json")]) == 0
    printed = capsys.readouterr().out
    assert "lagged edges (staleness 1" in printed
    assert "    lag 1: actor.generate.rollout_log_probs -> truncated_is_weight\n" in printed
    assert "    lag 1: grpo_advantage.advantages -> actor.update\n" in printed
    assert "actor.logprob.old_log_probs" not in printed  # recomputed on the trained weights: lag 0
    with pytest.warns(UserWarning, match="no off-policy correction"):
        assert main(["compile", "grpo", *argv, "--allow-uncorrected-staleness", "-o", str(tmp_path / "g.json")]) == 0
    assert "lag 1: grpo_advantage.advantages -> actor.update" in capsys.readouterr().out
    assert main(["compile", "grpo_is", *argv[:-4], "-o", str(tmp_path / "on.json")]) == 0
    assert "lagged edges" not in capsys.readouterr().out  # on-policy: no lag to show
