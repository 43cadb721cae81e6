"""A user's algorithm goes wherever a built-in one goes: the tutorial's RLOO + length penalty
(examples/custom_algorithm/rloo_lenpen.py) trains through the Python API, a Trainer subclass and
``hybridflow run algorithm=module:function``, and its op's outputs appear in the metrics."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from hybridflow.errors import ConfigError, UnknownAlgorithmError
from hybridflow.trainer import Trainer

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_algorithm"


@pytest.fixture(scope="module")
def rloo_lenpen():
    sys.path.insert(0, str(EXAMPLE))
    try:
        import rloo_lenpen

        yield rloo_lenpen
    finally:
        sys.path.remove(str(EXAMPLE))


def _config(fast_config, **overrides):
    return fast_config(rollout_batch_size=4, calibrate=False, **overrides)


def test_the_function_trains_through_the_python_api(rloo_lenpen, fast_config):
    config = _config(fast_config, algorithm_args={"len_penalty": 0.05}, clip_ratio_high=0.3)
    trainer = Trainer(config, algorithm=rloo_lenpen.rloo_lenpen)
    history = trainer.train()
    assert trainer.algorithm == "rloo_lenpen" and len(history) == 2
    assert dict(trainer.graph.attrs)["len_penalty"] == 0.05 and dict(trainer.graph.attrs)["clip_high"] == 0.3
    for m in history:
        # the custom op's output, summarised; it is the score minus 0.05 per response token
        # every float output is summarised, the generation's too (log-probs: at most 0, over valid tokens only)
        assert m["actor.generate/rollout_log_probs/min"] <= m["actor.generate/rollout_log_probs/max"] <= 0.0
        penalised, raw = m["length_penalty/scores/mean"], m["reward.score/scores/mean"]
        assert penalised < raw and penalised == pytest.approx(raw - 0.05 * m["response_length/mean"], abs=1e-6)
        assert m["reward/score/mean"] == raw and "critic/score/mean" not in m  # no critic: no critic/ prefix
        assert m["length_penalty/scores/min"] <= penalised <= m["length_penalty/scores/max"]


def test_a_subclass_and_a_module_path_name_the_same_algorithm(rloo_lenpen, fast_config):
    class RlooLenPenTrainer(Trainer):
        algorithm = rloo_lenpen.rloo_lenpen

    by_class = RlooLenPenTrainer(_config(fast_config, max_steps=1, output_dir=str(Path(fast_config().output_dir) / "a")))
    by_path = Trainer(_config(fast_config, max_steps=1, output_dir=str(Path(fast_config().output_dir) / "b"),
                              imports=("rloo_lenpen",)), algorithm="rloo_lenpen:rloo_lenpen")
    assert by_class.build_graph() == by_path.build_graph()
    first, second = by_class.train(), by_path.train()
    assert first[0]["length_penalty/scores/mean"] == second[0]["length_penalty/scores/mean"]


def test_a_graph_file_trains_and_refuses_attributes(rloo_lenpen, fast_config, tmp_path):
    path = tmp_path / "rloo_lenpen.json"
    path.write_text(rloo_lenpen.rloo_lenpen.build(n=2).to_json())
    trainer = Trainer(_config(fast_config, max_steps=1), algorithm=str(path))
    assert trainer.train()[0]["length_penalty/scores/mean"] <= 1.0
    with pytest.raises(ConfigError, match="has no attribute len_penalty"):
        Trainer(_config(fast_config, algorithm_args={"len_penalty": 0.1}), algorithm=str(path))


def test_bad_names_say_what_is_accepted(fast_config):
    with pytest.raises(UnknownAlgorithmError, match="unknown algorithm 'dpo'; choose one of ppo"):
        Trainer(_config(fast_config), algorithm="dpo")
    with pytest.raises(ConfigError, match="cannot import module 'no_such_module'"):
        Trainer(_config(fast_config), algorithm="no_such_module:fn")
    with pytest.raises(ConfigError, match="module 'json' has no 'nope'"):
        Trainer(_config(fast_config), algorithm="json:nope")
    with pytest.raises(ConfigError, match=r"algorithm 'grpo' has no attribute len_penalty; its attributes are n, "):
        Trainer(_config(fast_config, algorithm_args={"len_penalty": 0.1}), algorithm="grpo")


def test_hybridflow_run_with_module_function(rloo_lenpen, tiny_model_dir, tmp_path, monkeypatch, capsys):
    from hybridflow.cli import main

    monkeypatch.chdir(EXAMPLE)  # `module:function` resolves from the working directory, as `python -m` would
    run_file = tmp_path / "run.yaml"
    run_file.write_text(f"algorithm: rloo_lenpen:rloo_lenpen\nalgorithm_args: {{len_penalty: 0.02}}\n"
                        f"actor_model_name: {tiny_model_dir}\noutput_dir: {tmp_path / 'out'}\nmax_steps: 2\n"
                        "rollout_batch_size: 4\nmax_response_length: 3\ntrackers: [jsonl]\nprogress_bar: false\n"
                        "calibrate: false\nnum_threads: 1\nval_samples: 1\n")
    assert main(["run", str(run_file), "--import", "rloo_lenpen"]) == 0
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["step"] > 0 and "length_penalty/scores/mean" in r]
    assert len(steps) == 2 and all(r["length_penalty/scores/mean"] < r["reward.score/scores/mean"] for r in steps)
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert plan["graph"]["name"] == "rloo_lenpen"
    assert "done: 2 steps of rloo_lenpen" in capsys.readouterr().out
