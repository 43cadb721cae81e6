"""hybridflow diff: config, graph, plan and environment differences, and the first step and edge where two runs'
value hashes part; two real runs that differ only by the float order of one op."""
from __future__ import annotations

import json

import pytest
import torch

import hybridflow as hf
from hybridflow import cli
from hybridflow.commands.diff import diff_lines
from hybridflow.trainer import Trainer
from hybridflow.trainer.run_diff import Difference, first_divergence, mapping_differences
from hybridflow.trainer.run_folder import HashRecord, read_environment, read_hashes
from hybridflow.trainer.run_record import ValueHashes, tensor_digest


@hf.register_op("ordered_score", inputs=("scores: float32[B]", "old_log_probs: float32[B, R]", "response_mask: float32[B, R]"),
                outputs=("scores: float32[B]",))
def ordered_score(scores, old_log_probs, response_mask, *, order="left"):
    """s_i + (sum_t m_it * l_it + C - C), C = 2^20, the terms added left to right or right to left: the same sum in
    another float order. Left to right, the log-probs' sum is rounded to float32's step at 2^20 (1/8) before C leaves
    again; right to left the constants cancel first and the sum is kept: the bits differ wherever the sum is not a
    multiple of 1/8 (a sum of log-probs practically never is), so the first step already differs, by construction
    rather than by the luck of rounding. Shapes (b,), (b, r), (b, r) -> (b,)."""
    terms = list((old_log_probs * response_mask).unbind(-1)) + [torch.full_like(scores, 2.0**20), torch.full_like(scores, -2.0**20)]
    total = torch.zeros_like(scores)
    for term in terms if order == "left" else reversed(terms):
        total = total + term
    return scores + total


@hf.algorithm(roles={"reward": "rule"})
def ordered_grpo(prompts, actor, reward, *, n=2, order="left"):
    rollout = actor.generate(prompts, n=n)
    old_logp = actor.logprob(rollout)
    scores = hf.compute("ordered_score", reward.score(rollout), old_logp, rollout, order=order)
    actor.update(rollout, hf.compute("grpo_advantage", rollout, scores), old_logp, loss="ppo_clip")


def _records(rows):
    return [HashRecord(step, node, field, digest, pool) for step, node, field, digest, pool in rows]


def test_the_first_divergence_is_the_first_step_then_the_first_edge_in_plan_order():
    same = [(s, "prompts", "prompt_ids", f"p{s}", None) for s in (1, 2, 3, 4)]
    a = _records(same + [(s, "actor.logprob", "logprobs", f"l{s}", "actor") for s in (1, 2, 3, 4)]
                 + [(s, "actor.update", "loss", f"u{s}", "actor") for s in (1, 2, 3, 4)])
    # B's log-probs part from A's at step 3, and everything after follows; B lists its records in another order
    b = _records(list(reversed([(s, "actor.update", "loss", f"u{s}" if s < 3 else "x", "actor") for s in (1, 2, 3, 4)]
                               + [(s, "actor.logprob", "logprobs", f"l{s}" if s < 3 else "y", "actor") for s in (1, 2, 3, 4)]
                               + same)))
    found = first_divergence(sorted(a, key=lambda r: r.step), sorted(b, key=lambda r: r.step))
    assert (found.step, found.edge, found.pool) == (3, "actor.logprob.logprobs", "actor")
    assert str(found).startswith("step 3, `actor.logprob.logprobs` (pool actor): l3")
    assert first_divergence(a, a) is None
    missing = first_divergence(a, [r for r in a if not (r.step == 2 and r.node == "actor.update")])
    assert (missing.step, missing.edge, missing.digest_b) == (2, "actor.update.loss", None)


def test_mapping_differences_recurse_and_skip():
    rows = mapping_differences({"a": 1, "b": {"c": 2, "d": 3}, "out": "x"}, {"a": 1, "b": {"c": 5}, "out": "y"}, "config",
                               ignore=("out",))
    assert rows == [Difference("config.b.c", 2, 5), Difference("config.b.d", 3, None)]
    assert str(rows[1]) == "config.b.d: 3 -> (absent)"


def test_digests_are_of_the_bits():
    x = torch.tensor([0.1, 0.2, 0.3])
    assert tensor_digest(x) == tensor_digest(x.clone()) != tensor_digest(x.double())
    assert tensor_digest(x) != tensor_digest(x.reshape(3, 1))  # same bytes, another shape
    assert tensor_digest(torch.tensor([0.0])) != tensor_digest(torch.tensor([-0.0]))  # equal values, other bits
    assert tensor_digest(x.bfloat16()) == tensor_digest(x.bfloat16().clone())


def test_a_resumed_run_keeps_the_hashes_of_the_steps_before_it(tmp_path):
    from hybridflow.algorithms import ALGORITHMS
    from hybridflow.compiler import compile_for
    from hybridflow.compiler.passes import BatchShape

    plan = compile_for(ALGORITHMS["grpo"].build(), "qwen2.5-0.5b", batch=BatchShape(prompts=4, prompt_len=8, response_len=4))
    path = tmp_path / "hashes.jsonl"
    path.write_text("".join(json.dumps({"step": s, "node": "n", "field": "f", "digest": "d", "pool": None}) + "\n"
                            for s in (1, 2, 3)) + '{"step": 4, "no')  # a line cut by the interruption
    ValueHashes(path, plan=plan, resume_step=2)
    assert [r.step for r in read_hashes(tmp_path)] == [1, 2]
    ValueHashes(path, plan=plan)  # a fresh run starts anew, and keeps the earlier run's aside
    assert not path.exists() and [json.loads(line)["step"] for line in (tmp_path / "hashes.1.jsonl").read_text().splitlines()] == [1, 2]


def _run(fast_config, name: str, order: str, **overrides):
    config = fast_config(max_steps=3, rollout_batch_size=4, record_hashes=True, calibrate=False,
                         algorithm_args={"order": order}, output_dir=str(fast_config().output_dir) + name, **overrides)
    trainer = Trainer(config, algorithm=ordered_grpo)
    trainer.train()
    return trainer.output_dir


def test_diff_names_the_step_and_edge_of_a_planted_float_order_change(fast_config, capsys):
    left, right = _run(fast_config, "_left", "left"), _run(fast_config, "_right", "right")
    text = "\n".join(diff_lines(left, right))
    assert "config: 1 difference(s)\n  config.algorithm_args.order: left -> right" in text
    assert "graph: 1 difference(s)\n  graph.ordered_score.attrs.order: left -> right" in text
    assert "plan: same" in text and "environment: same" in text
    environment = read_environment(left)
    assert environment["packages"]["torch"] == torch.__version__ and environment["torch_threads"] == 1
    assert environment["python"] and environment["devices"]
    # the same seed: prompts, generation, log-probs and rewards agree; the reordered sum is the first to differ
    assert "values: first differ at step 1, `ordered_score.scores` (controller)" in text
    assert cli.main(["diff", str(left), str(left)]) == 0
    assert "values: bit-identical over the 3 step(s) both recorded (1..3)" in capsys.readouterr().out
