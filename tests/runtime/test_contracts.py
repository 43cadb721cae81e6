"""Run-time contract checks: a node whose output breaks its declaration is named at that node, not the next.

The probe algorithm below runs a custom op ``contract_baseline`` (declared ``baseline: float32[B]``)
whose ``mode`` attribute makes it misbehave, and a second op ``contract_adv_from_baseline`` that reads
its output: without the checks, a wrong baseline is either accepted silently (int64, NaN) or
blamed on the second op ([B, R]).
"""
from __future__ import annotations

from typing import NamedTuple

import pytest
import torch

import hybridflow as hf
from hybridflow.algorithms import ALGORITHMS
from hybridflow.compiler import compile_for
from hybridflow.compiler.passes import BatchShape
from hybridflow.errors import ContractError, HybridflowError
from hybridflow.runtime import contracts
from hybridflow.data import make_prompt_batch, make_tiny_model, make_tiny_tokenizer
from hybridflow.data.tasks.arithmetic import make_arithmetic_rows
from hybridflow.runtime.engines import SamplingParams, TrainEngineConfig
from hybridflow.batch import Batch
from hybridflow.runtime.local import LocalExecutor
from hybridflow.runtime.roles import RoleSpec
from hybridflow.runtime.worker import Worker
from hybridflow_ops.rewards.arithmetic import compute_score

torch.set_num_threads(1)
TOKENIZER = make_tiny_tokenizer("arithmetic")


def plan_local(graph):
    """``graph`` compiled and bound for this machine, every role on the CPU."""
    return compile_for(graph, "qwen2.5-0.5b", placement={r.name: "cpu" for r in graph.roles},
                       batch=BatchShape(prompts=2, prompt_len=8, response_len=3))


def _specs(graph, *, reward=compute_score):
    model = lambda seed=0: make_tiny_model("qwen2", vocab_size=len(TOKENIZER), hidden=32, layers=1, heads=2, kv_heads=1, seed=seed)
    kinds = {"policy": lambda: RoleSpec(model=model(), tokenizer=TOKENIZER, sampling=SamplingParams(max_new_tokens=3, seed=0),
                                        train=TrainEngineConfig(lr=1e-2)),
             "critic": lambda: RoleSpec(model=model(1), train=TrainEngineConfig(lr=1e-2)),
             "reference": lambda: RoleSpec(model=model())}
    return {r.name: kinds.get(r.kind, lambda: RoleSpec(reward=reward, tokenizer=TOKENIZER))() for r in graph.roles}


def _prompts(n=4):
    return make_prompt_batch(make_arithmetic_rows()[:n], TOKENIZER)


class Baseline(NamedTuple):
    baseline: torch.Tensor


class Advantages(NamedTuple):
    advantages: torch.Tensor


@hf.register_op("contract_baseline", inputs=("scores: float32[B]", "response_mask: float32[B, R]"),
                outputs=("baseline: float32[B]",), replace=True)
def contract_baseline(scores, response_mask, *, mode="ok"):
    """The batch's mean score per response, (b,) -> (b,); ``mode`` breaks the declaration on purpose."""
    base = scores.mean().expand_as(scores).clone()
    if mode == "int64":
        return Baseline(base.round().long())
    if mode == "wide":
        return Baseline(base[:, None] * response_mask)  # [B, R] where [B] is declared
    if mode == "nan":
        return Baseline(base / 0.0 * 0.0)
    if mode == "bare":
        return base  # a bare tensor: allowed for an op with one output
    if mode == "in_place":
        scores.sub_(base)  # the scores every later node reads are now centred too
    return Baseline(base)


@hf.register_op("contract_adv_from_baseline", inputs=("scores: float32[B]", "baseline: float32[B]", "response_mask: float32[B, R]"),
                outputs=("advantages: float32[B, R]",), replace=True)
def contract_adv_from_baseline(scores, baseline, response_mask):
    """(s - baseline) on every valid token; (b,), (b,), (b, r) -> (b, r)."""
    return Advantages((scores - baseline)[:, None] * response_mask)


@hf.algorithm
def contract_probe(prompts, actor, reward, *, mode="ok"):
    rollout = actor.generate(prompts, n=2)
    scores = reward.score(rollout)
    base = hf.compute("contract_baseline", rollout, scores, mode=mode)
    adv = hf.compute("contract_adv_from_baseline", rollout, scores, base)
    actor.update(rollout, adv, actor.logprob(rollout), loss="ppo_clip")


def run_probe(mode: str):
    graph = contract_probe.build(mode=mode)
    return LocalExecutor(plan_local(graph), _specs(graph)).run_iteration({"prompts": _prompts(2)})


def test_the_probe_passes_when_the_op_keeps_its_declaration():
    result = run_probe("ok")
    assert result.env["contract_adv_from_baseline"]["advantages"].shape == result.env["actor.generate"]["response_mask"].shape


def test_a_one_output_op_may_return_the_bare_tensor():
    ok, bare = run_probe("ok"), run_probe("bare")
    torch.testing.assert_close(bare.env["contract_baseline"]["baseline"], ok.env["contract_baseline"]["baseline"])


@pytest.mark.parametrize("mode, message", [
    ("int64", r"output 'baseline': declared baseline: float32\[B\*2\] but got int64\[4\]"),
    ("wide", r"output 'baseline': declared baseline: float32\[B\*2\], here \[B\*2=4\] \(rank 1\), but got shape "
             r"\[4, \d\] \(rank 2\)"),
    ("nan", r"output 'baseline': declared finite but holds nan at index \[0\]"),
    ("in_place", r"input 'scores': the op wrote into its input 'scores' \(in place\)"),
])
def test_a_broken_declaration_is_named_at_the_op_that_broke_it(mode, message):
    with pytest.raises(ContractError, match=r"node 'contract_baseline' \(op 'contract_baseline'\)") as caught:
        run_probe(mode)
    assert caught.match(message)
    assert caught.value.node == "contract_baseline" and caught.value.op == "contract_baseline"


def test_the_switch_and_the_environment_variable_turn_the_checks_off(monkeypatch):
    monkeypatch.setenv(contracts.ENV_VAR, "0")
    assert not contracts.enabled()
    run_probe("int64")  # accepted unchecked, as before the checks existed
    monkeypatch.delenv(contracts.ENV_VAR)
    contracts.set_enabled(False)
    try:
        run_probe("nan")
    finally:
        contracts.set_enabled(True)
    assert contracts.enabled()


def test_dims_are_bound_across_the_iteration(monkeypatch):
    # The actor's log-probs come back one token longer than the rollout's responses: R was bound
    # to the response length by actor.generate, so the breach is named at actor.logprob.
    logprob = Worker.logprob

    def one_token_too_many(self, role, batch):
        values = logprob(self, role, batch)
        return torch.cat([values, values[:, :1]], dim=1)

    monkeypatch.setattr(Worker, "logprob", one_token_too_many)
    with pytest.raises(ContractError, match=r"node 'actor.logprob' \(op 'logprob'\), output 'old_log_probs': declared "
                                            r"old_log_probs: float32\[B\*2, R\] but got shape \[4, (\d)\]: dim 1 is \1 but "
                                            r"R = \d in this iteration \(R = \d bound by actor.generate.response_ids\)"):
        run_probe("ok")


def test_a_binding_lives_for_one_iteration():
    # Response lengths differ between iterations (R is re-bound each time), the same executor runs on.
    graph = contract_probe.build()
    executor = LocalExecutor(plan_local(graph), _specs(graph))
    lengths = set()
    for n in (1, 2, 3, 4):
        result = executor.run_iteration({"prompts": _prompts(n)})
        lengths.add(tuple(result.env["actor.generate"]["response_ids"].shape))
    assert len(lengths) > 1


def test_contract_errors_are_project_errors():
    assert issubclass(ContractError, HybridflowError)
    with pytest.raises(ValueError, match="finite=.* must be True, False or a tuple of its output names"):
        hf.register_op("t_bad_finite", inputs=("scores: float32[B]",), outputs=("x: float32[B]",),
                       finite=("y",), replace=True)(lambda scores: None)


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_standard_algorithm_keeps_its_contracts(name, monkeypatch):
    checked = []
    check = contracts.check_node_output
    monkeypatch.setattr(contracts, "check_node_output", lambda node, *a: (checked.append(node.name), check(node, *a)))
    overrides = {"n": 2} if "n" in dict(ALGORITHMS[name].build().attrs) else {}
    graph = ALGORITHMS[name].build(**overrides, **({"k": 2} if name == "passk" else {}))  # pass@k needs n >= k
    reward = (lambda *a, **k: 1.0) if name == "safe_rlhf" else None
    executor = LocalExecutor(plan_local(graph), _specs(graph, **({"reward": reward} if reward else {})))
    for _ in range(2):
        executor.run_iteration({"prompts": _prompts(3)})
    assert {n.name for n in graph.nodes if n.kind != "compute" and n.outputs.fields} <= set(checked)


def test_inputs_bound_in_two_scopes_must_agree():
    # The Ray executor's overlapped step reads a rollout checked in the generation's scope and
    # log-probs checked in the step's: a compute node reading both checks that they agree on R.
    graph = ALGORITHMS["grpo"].build(n=2, kl_loss=False)
    rollout = Batch({"prompt_ids": torch.zeros(4, 2, dtype=torch.long), "prompt_mask": torch.ones(4, 2, dtype=torch.long),
                     "response_ids": torch.zeros(4, 3, dtype=torch.long), "response_mask": torch.ones(4, 3),
                     "rollout_log_probs": torch.zeros(4, 3), "group_index": torch.tensor([0, 0, 1, 1]),
                     "policy_version": torch.zeros(4, 3, dtype=torch.long)})
    generation_metrics, step_metrics = {}, {}
    contracts.check_node_output(graph.node("actor.generate"), rollout, generation_metrics)
    scores = Batch({"scores": torch.ones(4)})
    contracts.check_node_output(graph.node("reward.score"), scores, step_metrics)
    inputs = Batch({"scores": scores["scores"], "group_index": rollout["group_index"], "response_mask": rollout["response_mask"]})
    contracts.check_compute_results(graph.node("grpo_advantage"), inputs, (torch.zeros(4, 3),), ("advantages",))

    longer = Batch({"old_log_probs": torch.zeros(4, 5)})
    contracts.check_node_output(graph.node("actor.logprob"), longer, {})  # R = 5 in a third scope
    mixed = Batch({"response_mask": rollout["response_mask"], "old_log_probs": longer["old_log_probs"]})
    with pytest.raises(ContractError, match=r"node 'grpo_advantage' .*inputs disagree on dim 'R': 3 \(from "
                                            r"actor.generate.response_ids\) vs 5 \(from actor.logprob.old_log_probs\)"):
        contracts.check_compute_results(graph.node("grpo_advantage"), mixed, (torch.zeros(4, 3),), ("advantages",))
