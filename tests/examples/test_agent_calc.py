"""examples/agent_calc: the script writes the data and a warmed-up model, and config.yaml is its RL stage as a run file."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from hybridflow.algorithms import resolve_algorithm
from hybridflow.trainer.config import algorithm_attrs
from hybridflow.trainer.config_files import load_run_config

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agent_calc"


def test_the_script_warms_up_a_model_for_the_run_file(tmp_path):
    spec = importlib.util.spec_from_file_location("agent_calc_train", EXAMPLE / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    threads = torch.get_num_threads()
    try:
        written = module.main(["--out", str(tmp_path / "run"), "--warmup-only", "--warmup-steps", "2"])
    finally:
        torch.set_num_threads(threads)
    assert (Path(written["model"]) / "config.json").is_file()
    assert len(Path(written["train"]).read_text().splitlines()) > 1900
    assert len(Path(written["val"]).read_text().splitlines()) == 100


def test_the_run_file_builds_the_multi_turn_graph():
    algorithm_name, config = load_run_config(EXAMPLE / "config.yaml")
    algorithm = resolve_algorithm(algorithm_name)
    graph = algorithm.build(**algorithm_attrs(config, algorithm.defaults))
    (generate,) = [n for n in graph.nodes if n.kind == "generate"]
    assert generate.attrs.agent == {"env": "calc", "max_turns": 3, "max_tokens_per_turn": 12, "max_total_tokens": 40}
