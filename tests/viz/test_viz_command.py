"""`hybridflow viz`: algorithm names, graph JSON files, overrides, and errors as messages with exit code 1."""
from __future__ import annotations

import json
import shutil

from hybridflow.algorithms import ALGORITHMS
from hybridflow.cli import main


def _svg_or_hint(out, capsys) -> str:
    printed = capsys.readouterr().out
    assert out.with_suffix(".dot").exists()
    if shutil.which("dot"):
        assert out.with_suffix(".svg").exists() and "wrote" in printed
    else:
        assert "install graphviz" in printed
    return printed


def test_viz_algorithm_by_name(tmp_path, capsys):
    assert main(["viz", "ppo", "-o", str(tmp_path / "out" / "ppo")]) == 0
    _svg_or_hint(tmp_path / "out" / "ppo", capsys)
    if shutil.which("dot"):
        svg = (tmp_path / "out" / "ppo.svg").read_text()
        for name in ("actor.generate", "critic.values", "ref.logprob", "reward.score", "gae", "actor.update", "critic.update"):
            assert name in svg


def test_viz_with_overrides(tmp_path, capsys):
    assert main(["viz", "grpo", "-o", str(tmp_path / "g"), "--set", "n=3", "--set", "kl_type=k3"]) == 0
    dot = (tmp_path / "g.dot").read_text()
    assert "n=3" in dot and "kl_type=k3" in dot


def test_viz_graph_json_file(tmp_path, capsys):
    path = tmp_path / "remax.json"
    path.write_text(ALGORITHMS["remax"].build().to_json())
    assert main(["viz", str(path), "-o", str(tmp_path / "drawn")]) == 0
    _svg_or_hint(tmp_path / "drawn", capsys)
    assert "actor.generate_greedy" in (tmp_path / "drawn.dot").read_text()


def test_viz_graph_json_with_ops_this_process_does_not_know(tmp_path, capsys):
    doc = json.loads(ALGORITHMS["grpo"].build().to_json())
    node = next(n for n in doc["nodes"] if n["kind"] == "compute")
    node["op"] = "someone_elses_op"  # registered by a module the CLI never imported
    path = tmp_path / "custom.json"
    path.write_text(json.dumps(doc))
    assert main(["viz", str(path), "-o", str(tmp_path / "custom")]) == 0
    assert "someone_elses_op" in (tmp_path / "custom.dot").read_text()


def test_viz_errors_are_messages(tmp_path, capsys):
    assert main(["viz", "no_such_algorithm"]) == 1
    assert "unknown algorithm 'no_such_algorithm'" in capsys.readouterr().err
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"traceEvents": []}))
    assert main(["viz", str(other)]) == 1
    assert "not a document viz can draw" in capsys.readouterr().err
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert main(["viz", str(broken)]) == 1
    assert "not JSON" in capsys.readouterr().err
    assert main(["viz", "grpo", "--set", "nonsense"]) == 1
    assert "KEY=VALUE" in capsys.readouterr().err
    assert main(["viz", "grpo", "--set", "beam=2"]) == 1
    assert "no attribute beam" in capsys.readouterr().err


def _graph_with_an_undeclared_role(tmp_path):
    doc = json.loads(ALGORITHMS["grpo"].build().to_json())
    node = next(n for n in doc["nodes"] if n["kind"] == "compute")
    node["role"] = "ghost"
    path = tmp_path / "ghost.json"
    path.write_text(json.dumps(doc))
    return path, node["name"]


def test_viz_draws_an_invalid_graph_but_fails_with_the_dsl_s_error(tmp_path, capsys):
    path, node = _graph_with_an_undeclared_role(tmp_path)
    assert main(["viz", str(path), "-o", str(tmp_path / "ghost")]) == 1
    captured = capsys.readouterr()
    assert f"node {node!r}" in captured.err and "ghost" in captured.err
    assert "the graph is invalid" in captured.out and (tmp_path / "ghost.dot").is_file()


def test_viz_checks_a_plan_before_drawing_it(tmp_path, capsys):
    from hybridflow.compiler.compile import compile
    from hybridflow.compiler.passes import BatchShape

    graph = ALGORITHMS["grpo"].build()
    doc = json.loads(compile(graph, "cpu-local", {"actor": "qwen2.5-0.5b", "reward": "rule"}, placement="colocate",
                             batch=BatchShape(prompts=8, prompt_len=16, response_len=16)).to_json())
    dropped = doc["placements"].pop()["role"]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    assert main(["viz", str(path), "-o", str(tmp_path / "plan")]) == 1
    assert f"role {dropped!r} is placed 0 times" in capsys.readouterr().err
