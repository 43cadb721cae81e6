"""Multi-turn rollouts: token in, token out; observations never trained; samples progress independently.

A random tiny model (character tokenizer over the agent_calc alphabet) plays against environments
defined here. The equality of what is trained and what was sampled is checked through the
log-probs: the train engine's log-probs of the final trajectory (prompt + response, one forward)
equal the sampler's at every model token, which holds only if every turn's context was the same
token sequence the trajectory ends with.
"""
from __future__ import annotations

import threading

import pytest
import torch

from hybridflow.agents import register_env
from hybridflow.data import make_prompt_batch, make_tiny_model
from hybridflow.data.tasks.agent_calc import ALPHABET, make_sum3_rows
from hybridflow.data.tiny import make_tiny_tokenizer
from hybridflow.errors import AgentError
from hybridflow.runtime.engines import TrainEngine, TrainEngineConfig
from hybridflow.runtime.engines.agent_loop import AgentParams
from hybridflow.runtime.engines.rollout_hf import HFRolloutEngine
from hybridflow.runtime.engines.sampling import SamplingParams
from hybridflow_ops.losses.policy import ppo_clip

torch.set_num_threads(1)


class RecordingEnv:
    """Records each action it read and each observation it returned (``{length of the action}``); the
    episode lasts three steps whatever the model writes, so every sample has observations."""

    def reset(self, prompt):
        self.actions, self.observations = [], ["0+"]
        return "0+"

    def step(self, action):
        self.actions.append(action)
        done = len(self.actions) >= 3
        observation = "" if done else "{" + str(len(action)) + "}"
        if observation:
            self.observations.append(observation)
        return observation, float(done), done, {"tool_calls": 1, "tool_errors": 0}


RECORDED: list[RecordingEnv] = []


@register_env("test_recording")
def recording_env() -> RecordingEnv:
    env = RecordingEnv()
    RECORDED.append(env)
    return env


@pytest.fixture(scope="module")
def setup():
    tokenizer = make_tiny_tokenizer(alphabet=ALPHABET)
    model = make_tiny_model(vocab_size=len(tokenizer), hidden=32, layers=2, seed=3)
    prompts = make_prompt_batch(make_sum3_rows(4, seed=5), tokenizer)
    return tokenizer, model, prompts


def _segments(mask_row: torch.Tensor) -> list[tuple[bool, int, int]]:
    """``(is_model, start, end)`` runs of a response mask row (up to its last non-padding position)."""
    runs, start = [], 0
    values = mask_row.tolist()
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] != values[start]:
            runs.append((values[start] == 1.0, start, i))
            start = i
    return runs


def test_what_is_trained_is_what_was_sampled(setup):
    tokenizer, model, prompts = setup
    RECORDED.clear()
    engine = HFRolloutEngine(model, tokenizer=tokenizer)
    agent = AgentParams(env="test_recording", max_turns=3, max_tokens_per_turn=6, max_total_tokens=64)
    rollout = engine.generate_agentic(prompts, SamplingParams(n=2, seed=0), agent)
    assert len(rollout) == 8 and rollout["response_ids"].shape == (8, 64)
    # the log-probs the actor computes for the final sequences are the sampler's, at every model token
    train = TrainEngine(model, TrainEngineConfig(lr=1e-3))
    recomputed = train.compute_log_probs(rollout)
    model_tokens = rollout["response_mask"] == 1
    assert int(model_tokens.sum()) > 40
    assert torch.allclose(recomputed[model_tokens], rollout["rollout_log_probs"][model_tokens], atol=1e-5)
    assert (rollout["rollout_log_probs"][~model_tokens] == 0).all()
    # model runs are the turns the env read; the runs between are each observation's tokens, tokenised once
    for row, env in enumerate(RECORDED):
        ids, length = rollout["response_ids"][row], int(rollout["turn_index"][row].ge(0).sum())
        runs = [r for r in _segments(rollout["response_mask"][row][:length])]
        model_runs = [ids[a:b].tolist() for is_model, a, b in runs if is_model]
        obs_runs = [ids[a:b].tolist() for is_model, a, b in runs if not is_model]
        assert len(model_runs) == int(rollout["num_turns"][row]) == len(env.actions) == 3
        for turn, action in zip(model_runs, env.actions):
            assert tokenizer.decode(turn, skip_special_tokens=True) == action
        expected = [tokenizer(o, add_special_tokens=False)["input_ids"] for o in env.observations]
        assert obs_runs == expected
        assert float(rollout["env_reward"][row]) == 1.0 and int(rollout["tool_calls"][row]) == 3
        assert rollout["turn_index"][row][:length].tolist() == sorted(rollout["turn_index"][row][:length].tolist())


def test_observation_tokens_do_not_reach_the_loss(setup):
    tokenizer, model, prompts = setup
    engine = HFRolloutEngine(model, tokenizer=tokenizer)
    agent = AgentParams(env="test_recording", max_turns=3, max_tokens_per_turn=6, max_total_tokens=64)
    rollout = engine.generate_agentic(prompts, SamplingParams(n=1, seed=1), agent)
    mask, old = rollout["response_mask"], rollout["rollout_log_probs"]
    log_probs = (old + 0.1 * torch.randn(old.shape, generator=torch.Generator().manual_seed(0))).requires_grad_()
    advantages = torch.randn(old.shape, generator=torch.Generator().manual_seed(1))
    loss = ppo_clip(log_probs, old, advantages, mask).loss
    (grad,) = torch.autograd.grad(loss, log_probs)
    assert (grad[mask == 0] == 0).all() and (grad[mask == 1] != 0).any()
    noise = torch.where(mask == 0, 100.0, 0.0)
    assert ppo_clip(log_probs + noise, old - noise, advantages + noise, mask).loss == loss


def test_budgets_bound_every_trajectory(setup):
    tokenizer, model, prompts = setup
    engine = HFRolloutEngine(model, tokenizer=tokenizer)
    agent = AgentParams(env="calc", max_turns=2, max_tokens_per_turn=5, max_total_tokens=12)
    rollout = engine.generate_agentic(prompts, SamplingParams(n=4, seed=2), agent)
    lengths = rollout["turn_index"].ge(0).sum(-1)
    assert rollout["response_ids"].shape[1] == 12 and (lengths <= 12).all()
    assert (rollout["num_turns"] <= 2).all() and (rollout["num_turns"] >= 1).all()
    for k in range(2):
        per_turn = ((rollout["turn_index"] == k) & (rollout["response_mask"] == 1)).sum(-1)
        assert (per_turn <= 5).all()
    assert (rollout["tool_errors"] <= rollout["tool_calls"]).all()
    assert list(rollout["group_index"]) == [i // 4 for i in range(16)]


class GatedEnv:
    """Three fixed steps per episode; the first step of the prompt marked slow blocks until every other
    sample's episode is over (or 30 s pass, which a loop that waits for the slowest step would need)."""

    lock = threading.Lock()
    fast_done = 0
    fast_total = 0
    released = threading.Event()
    slow_saw_others_done: list[bool] = []

    def reset(self, prompt):
        self.slow, self.steps = prompt["extra_info"].get("slow", False), 0
        return ""

    def step(self, action):
        self.steps += 1
        if self.slow and self.steps == 1:
            GatedEnv.slow_saw_others_done.append(GatedEnv.released.wait(timeout=30))
        done = self.steps >= 3
        if done and not self.slow:
            with GatedEnv.lock:
                GatedEnv.fast_done += 1
                if GatedEnv.fast_done == GatedEnv.fast_total:
                    GatedEnv.released.set()
        return ("" if done else "{ok}"), 0.0, done, {}


register_env("test_gated")(GatedEnv)


def test_a_slow_step_holds_back_only_its_own_sample(setup):
    tokenizer, model, _ = setup
    rows = make_sum3_rows(4, seed=9)
    rows[0]["extra_info"] = {"slow": True}
    prompts = make_prompt_batch(rows, tokenizer)
    GatedEnv.fast_done, GatedEnv.fast_total = 0, 6
    GatedEnv.released.clear()
    GatedEnv.slow_saw_others_done.clear()
    engine = HFRolloutEngine(model, tokenizer=tokenizer)
    agent = AgentParams(env="test_gated", max_turns=3, max_tokens_per_turn=4, max_total_tokens=40)
    rollout = engine.generate_agentic(prompts, SamplingParams(n=2, seed=3), agent)
    # both samples of the slow prompt waited in their first step until the six others had run all three turns
    assert GatedEnv.slow_saw_others_done == [True, True]
    assert rollout["num_turns"].tolist() == [3] * 8


def test_an_unknown_environment_is_named(setup):
    tokenizer, model, prompts = setup
    engine = HFRolloutEngine(model, tokenizer=tokenizer)
    with pytest.raises(AgentError, match="no_such_env"):
        engine.generate_agentic(prompts, SamplingParams(), AgentParams(env="no_such_env"))
    with pytest.raises(AgentError, match="cannot import"):
        engine.generate_agentic(prompts, SamplingParams(), AgentParams(env="no_such_module:Env"))


class BrokenEnv:
    def reset(self, prompt):
        return ""

    def step(self, action):
        raise KeyError("oops")


register_env("test_broken")(BrokenEnv)


def test_an_environment_that_raises_is_named(setup):
    tokenizer, model, prompts = setup
    engine = HFRolloutEngine(model, tokenizer=tokenizer)
    with pytest.raises(AgentError, match="BrokenEnv.step raised KeyError"):
        engine.generate_agentic(prompts, SamplingParams(), AgentParams(env="test_broken", max_tokens_per_turn=2))


def test_observations_can_go_through_the_chat_template(setup):
    tokenizer, model, prompts = setup
    RECORDED.clear()
    engine = HFRolloutEngine(model, tokenizer=tokenizer)
    agent = AgentParams(env="test_recording", max_turns=3, max_tokens_per_turn=4, max_total_tokens=80,
                        observation_role="user")
    rollout = engine.generate_agentic(prompts.select("prompt_ids", "prompt_mask", "ground_truth", "prompt",
                                                     "data_source", "extra_info")[:1], SamplingParams(seed=4), agent)
    ids, mask = rollout["response_ids"][0], rollout["response_mask"][0]
    runs = _segments(mask[:int(rollout["turn_index"][0].ge(0).sum())])
    obs_runs = [ids[a:b].tolist() for is_model, a, b in runs if not is_model]
    expected = tokenizer("<user>0+<eos><assistant>", add_special_tokens=False)["input_ids"]
    assert obs_runs[0] == expected  # the reset observation as a user message, no BOS in the middle of a trajectory
    train = TrainEngine(model, TrainEngineConfig(lr=1e-3))
    model_tokens = mask == 1
    assert torch.allclose(train.compute_log_probs(rollout)[0][model_tokens], rollout["rollout_log_probs"][0][model_tokens],
                          atol=1e-5)
