"""Multi-turn rollouts against an environment, token in and token out.

A trajectory is a list of token ids from the first model token on: each model turn is
appended as the ids the sampler drew (with their log-probs, mask 1), each observation as
the ids of its text tokenised once (mask 0, log-prob 0). Earlier turns are never decoded and
encoded again: the next turn's context is ``prompt ids + trajectory ids``, so the sequence the
train engine reads (``prompt_ids``, ``response_ids``) is exactly the one the model sampled
from. Only the text of the newest turn is decoded, for the environment to read.

Samples progress independently. A turn is decoded for every sample that is ready (waiting
for no environment step), then each sample's ``env.step`` is submitted to a thread pool; the
loop decodes the next turn for whichever samples' steps have finished, so a slow tool call
holds back only its own sample. Steps that finish within ``gather_s`` of the first one join
the same decoding batch.

Where the environments live is an :class:`EnvHost`'s choice: :class:`InProcessEnvs` (the default,
the LocalExecutor's) builds them in this process, so their steps run on the loop's threads; the
RayExecutor's (:mod:`hybridflow.runtime.ray.env_pool`) builds each sample's environment in one
worker of the plan's environment pool and hands back a proxy whose ``reset``/``step`` call it
there, so tool calls run in those processes while the loop's threads only wait for them.

A sample stops when its environment says ``done``, after ``max_turns`` model turns, or when
the trajectory reaches ``max_total_tokens`` (a turn is cut to what is left of the budget, an
observation too). Outputs (``B = prompts x n`` rows, ``R = max_total_tokens``):

- ``response_ids`` int64[B, R], ``response_mask`` float32[B, R] (1 only on model tokens),
  ``rollout_log_probs`` float32[B, R] (0 off model tokens),
- ``turn_index`` int64[B, R]: the model turn a position belongs to (an observation belongs to
  the turn it answers; the one from ``reset`` to turn 0), -1 at padding,
- ``num_turns`` int64[B], ``env_reward`` float32[B] (sum of step rewards), ``tool_calls`` and
  ``tool_errors`` int64[B] (sums of the steps' ``info`` counts),
- columns ``responses`` (the last model turn's text: the final answer), ``trajectories``
  (the whole trajectory's text), ``agent_segments`` (JSON: each turn and observation's text and
  ids) and ``agent_steps`` (JSON: each step's reward, done and info), for logs.
"""
from __future__ import annotations

import concurrent.futures as cf
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

import torch
from pydantic import BaseModel, ConfigDict, Field

from hybridflow.agents.env import as_step_result, resolve_env
from hybridflow.capabilities import AGENT_DEFAULTS
from hybridflow.errors import AgentError

from ...batch import Batch
from .decode import decode
from .sampling import SamplingParams

__all__ = ["AgentParams", "AGENT_FIELDS", "TurnDecoder", "EnvHost", "InProcessEnvs", "env_name", "agent_rollout",
           "hf_turn_decoder"]

AGENT_FIELDS = ("turn_index", "num_turns", "env_reward", "tool_calls", "tool_errors")
"""The fields an agentic rollout has beyond a single-turn one."""


class AgentParams(BaseModel):
    """How a rollout node with an environment runs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    env: str = Field(description="The environment: a registered name or 'package.module:Class'.")
    max_turns: int = Field(AGENT_DEFAULTS["max_turns"], ge=1, description="Model turns per sample at most.")
    max_tokens_per_turn: int = Field(AGENT_DEFAULTS["max_tokens_per_turn"], ge=1, description="Tokens one model turn may sample.")
    max_total_tokens: int = Field(AGENT_DEFAULTS["max_total_tokens"], ge=1, description="Tokens of a trajectory (model and observation) at most; R.")
    tool_workers: int = Field(8, ge=1, description="Threads running environment steps (tool calls) concurrently; with environments in an environment pool, at least as many as the pool runs at once (EnvHost.concurrency).")
    gather_s: float = Field(0.005, ge=0.0, description="Steps finishing this long after the first join its decoding batch.")
    observation_role: str | None = Field(None, description="None: an observation is appended as its text. A role ('user', 'tool'): the tokenizer's chat template renders it as a message of that role followed by the generation prompt (the template's opening BOS dropped: it opens a conversation, not a turn).")


class EnvHost(Protocol):
    """Where a rollout's environments live: ``open`` makes ``count`` environments of ``env`` (a spec,
    :func:`~hybridflow.agents.env.resolve_env`) with ``reset``/``step`` (and ``stop_strings`` when the environment
    has them); ``close`` lets them go after the rollout. A host whose environments run elsewhere may say how many
    calls it runs at once (``concurrency``): the loop then keeps that many steps in flight (its threads only wait)."""

    def open(self, env: str, count: int) -> list[Any]:
        ...

    def close(self, envs: Sequence[Any]) -> None:
        ...


class InProcessEnvs:
    """Environments in this process: one instance per sample, stepped on the loop's threads."""

    def open(self, env: str, count: int) -> list[Any]:
        factory = resolve_env(env)
        return [factory() for _ in range(count)]

    def close(self, envs: Sequence[Any]) -> None:
        pass


def env_name(env: Any) -> str:
    """The environment's class name, for messages (a remote environment's proxy says its environment's)."""
    return getattr(env, "env_name", None) or type(env).__name__


@dataclass
class _Sample:
    prompt: list[int]
    row: Mapping[str, Any]
    env: Any
    ids: list[int] = field(default_factory=list)
    mask: list[float] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    turns_of: list[int] = field(default_factory=list)
    turns: int = 0
    reward: float = 0.0
    tool_calls: int = 0
    tool_errors: int = 0
    last_turn: list[int] = field(default_factory=list)
    steps: list[dict] = field(default_factory=list)
    segments: list[tuple[bool, int]] = field(default_factory=list)
    done: bool = False

    def append(self, ids: Sequence[int], log_probs: Sequence[float] | None, turn: int) -> None:
        if ids:
            self.segments.append((log_probs is not None, len(ids)))
        self.ids.extend(ids)
        self.mask.extend([1.0 if log_probs is not None else 0.0] * len(ids))
        self.log_probs.extend(log_probs if log_probs is not None else [0.0] * len(ids))
        self.turns_of.extend([turn] * len(ids))


def _rows(batch: Batch) -> list[dict[str, Any]]:
    names = list(batch.columns)
    return [{name: batch.columns[name][i] for name in names} for i in range(len(batch))]


def _stop_ids(tokenizer, env: Any) -> tuple[int, ...]:
    """Ids of the environment's stop strings that are one token each (a tool call's closing marker)."""
    ids = []
    for text in getattr(env, "stop_strings", ()):
        encoded = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(encoded) == 1:
            ids.append(int(encoded[0]))
    return tuple(ids)


def _as_message(tokenizer, role: str, text: str) -> str:
    """``text`` as a chat message of ``role`` and the generation prompt, through the tokenizer's chat template."""
    if not getattr(tokenizer, "chat_template", None):
        raise AgentError(f"observation_role={role!r} needs a tokenizer with a chat template; this one has none")
    rendered = tokenizer.apply_chat_template([{"role": role, "content": text}], add_generation_prompt=True,
                                             tokenize=False)
    bos = getattr(tokenizer, "bos_token", None)
    return rendered[len(bos):] if bos and rendered.startswith(bos) else rendered


def _left_padded(contexts: Sequence[Sequence[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(c) for c in contexts)
    ids = torch.full((len(contexts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(contexts), width), dtype=torch.long)
    for i, context in enumerate(contexts):
        ids[i, width - len(context):] = torch.tensor(context, dtype=torch.long)
        mask[i, width - len(context):] = 1
    return ids.to(device), mask.to(device)


TurnDecoder = Callable[[list[list[int]], int, tuple[int, ...]], list[tuple[list[int], list[float]]]]
"""``(contexts, max_new_tokens, stop_ids) -> [(tokens, log_probs), ...]``: one sampled turn per context (token ids, the
prompt's and the trajectory's so far), ending at an end-of-sequence id or one of ``stop_ids`` (included) or after
``max_new_tokens``, with each token's log-probability under the sampling distribution. A rollout engine's own."""


def hf_turn_decoder(model: torch.nn.Module, params: SamplingParams, *, eos_token_ids: Sequence[int], pad_token_id: int,
                    generator: torch.Generator | None, device) -> TurnDecoder:
    """Turns of a transformers model through :func:`.decode.decode`: the contexts left-padded into one batch."""

    def turns(contexts: list[list[int]], budget: int, stop_ids: tuple[int, ...]) -> list[tuple[list[int], list[float]]]:
        ids, mask = _left_padded(contexts, pad_token_id, device)
        out = decode(model, ids, mask, params.model_copy(update={"n": 1, "max_new_tokens": budget}),
                     eos_token_ids=tuple(eos_token_ids) + stop_ids, pad_token_id=pad_token_id, generator=generator)
        kept = [int(n) for n in out.response_mask.sum(-1)]
        return [(out.response_ids[row, :k].tolist(), out.log_probs[row, :k].tolist()) for row, k in enumerate(kept)]

    return turns


class _Loop:
    def __init__(self, turns: TurnDecoder, tokenizer, agent: AgentParams, threads: int):
        self.turns, self.tokenizer, self.agent, self.threads = turns, tokenizer, agent, threads
        self.stop_ids: tuple[int, ...] = ()

    def observe(self, sample: _Sample, text: str, turn: int) -> None:
        if not isinstance(text, str):
            raise AgentError(f"environment {env_name(sample.env)} returned a {type(text).__name__} "
                             "observation; observations are text")
        if not text:
            return
        if self.agent.observation_role:
            text = _as_message(self.tokenizer, self.agent.observation_role, text)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        room = self.agent.max_total_tokens - len(sample.ids)
        sample.append(ids[:room], None, turn)
        if len(sample.ids) >= self.agent.max_total_tokens:
            sample.done = True

    def decode_turn(self, ready: list[_Sample]) -> None:
        """One model turn for each sample of ``ready``, appended to its trajectory."""
        budget = max(min(self.agent.max_tokens_per_turn, self.agent.max_total_tokens - len(s.ids)) for s in ready)
        sampled = self.turns([s.prompt + s.ids for s in ready], budget, self.stop_ids)
        for sample, (tokens, log_probs) in zip(ready, sampled):
            room = min(self.agent.max_tokens_per_turn, self.agent.max_total_tokens - len(sample.ids))
            tokens, log_probs = list(tokens[:room]), list(log_probs[:room])
            sample.append(tokens, log_probs, sample.turns)
            sample.last_turn = tokens
            sample.turns += 1

    def apply_step(self, sample: _Sample, result: Any) -> None:
        step = as_step_result(result, sample.env)
        sample.reward += step.reward
        sample.tool_calls += int(step.info.get("tool_calls", 0))
        sample.tool_errors += int(step.info.get("tool_errors", 0))
        sample.steps.append({"reward": step.reward, "done": step.done,
                             **{k: v for k, v in step.info.items() if isinstance(v, (int, float, str, type(None)))}})
        if step.done or sample.turns >= self.agent.max_turns:
            sample.done = True
            return
        self.observe(sample, step.observation, sample.turns - 1)

    def action_text(self, sample: _Sample) -> str:
        return self.tokenizer.decode(sample.last_turn, skip_special_tokens=True)

    def run(self, samples: list[_Sample]) -> None:
        self.stop_ids = _stop_ids(self.tokenizer, samples[0].env) if samples else ()
        for sample in samples:
            try:
                first = sample.env.reset(sample.row)
            except Exception as err:
                raise AgentError(f"environment {env_name(sample.env)}.reset failed on prompt "
                                 f"{sample.row.get('prompt')!r}: {type(err).__name__}: {err}") from err
            self.observe(sample, first, 0)
        ready = [s for s in samples if not s.done]
        pending: dict[cf.Future, _Sample] = {}
        with cf.ThreadPoolExecutor(self.threads, thread_name_prefix="hf-env") as pool:
            while ready or pending:
                if ready:
                    self.decode_turn(ready)
                    for sample in ready:
                        pending[pool.submit(sample.env.step, self.action_text(sample))] = sample
                    ready = []
                finished, _ = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
                if self.agent.gather_s and len(finished) < len(pending):
                    cf.wait(pending, timeout=self.agent.gather_s, return_when=cf.ALL_COMPLETED)
                for future in [f for f in pending if f.done()]:
                    sample = pending.pop(future)
                    self.apply_step(sample, _result(future, sample))
                    if not sample.done and len(sample.ids) < self.agent.max_total_tokens:
                        ready.append(sample)
                    else:
                        sample.done = True


def _result(future: cf.Future, sample: _Sample) -> Any:
    """A step's return value; an environment that raised is a bug of the environment, named (a model's
    mistakes are observations, which the environment makes)."""
    try:
        return future.result()
    except Exception as err:
        raise AgentError(f"environment {env_name(sample.env)}.step raised {type(err).__name__}: {err} "
                         "(an environment turns what the model did wrong into an observation)") from err


def _fields(samples: Sequence[_Sample], width: int, pad_id: int) -> dict[str, Any]:
    b = len(samples)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    mask = torch.zeros((b, width), dtype=torch.float32)
    log_probs = torch.zeros((b, width), dtype=torch.float32)
    turn_index = torch.full((b, width), -1, dtype=torch.long)
    for i, s in enumerate(samples):
        n = len(s.ids)
        ids[i, :n] = torch.tensor(s.ids, dtype=torch.long)
        mask[i, :n] = torch.tensor(s.mask)
        log_probs[i, :n] = torch.tensor(s.log_probs)
        turn_index[i, :n] = torch.tensor(s.turns_of, dtype=torch.long)
    return {
        "response_ids": ids, "response_mask": mask, "rollout_log_probs": log_probs, "turn_index": turn_index,
        "num_turns": torch.tensor([s.turns for s in samples], dtype=torch.long),
        "env_reward": torch.tensor([s.reward for s in samples], dtype=torch.float32),
        "tool_calls": torch.tensor([s.tool_calls for s in samples], dtype=torch.long),
        "tool_errors": torch.tensor([s.tool_errors for s in samples], dtype=torch.long),
    }


@torch.no_grad()
def agent_rollout(turns: TurnDecoder, tokenizer, batch: Batch, params: SamplingParams, agent: AgentParams, *,
                  eos_token_ids: Sequence[int], pad_token_id: int, envs: EnvHost | None = None) -> Batch:
    """``params.n`` trajectories per prompt of ``batch`` against ``agent.env`` (module docstring for the fields),
    each model turn sampled by ``turns`` (the rollout engine's :data:`TurnDecoder`: :func:`hf_turn_decoder`, or
    vLLM's), against environments ``envs`` opens (default :class:`InProcessEnvs`).

    Returns the batch repeated ``n`` times (``repeat_interleave`` order, with ``group_index``) with the
    rollout's fields, and a column ``agent_steps``: each trajectory's steps (reward, done, info) as JSON.
    """
    if tokenizer is None:
        raise AgentError("an agentic rollout needs the rollout engine's tokenizer (observations are text)")
    host = envs or InProcessEnvs()
    rows = _rows(batch)
    environments = host.open(agent.env, len(rows) * params.n)
    try:
        samples = []
        for i, row in enumerate(rows):
            prompt = batch["prompt_ids"][i][batch["prompt_mask"][i] != 0].tolist()
            samples.extend(_Sample(prompt, row, environments[i * params.n + k]) for k in range(params.n))
        loop = _Loop(turns, tokenizer, agent, max(agent.tool_workers, getattr(host, "concurrency", 0)))
        loop.run(samples)
    finally:
        host.close(environments)
    fields = _fields(samples, agent.max_total_tokens, pad_token_id)
    repeated = batch.repeat_interleave(params.n) if params.n > 1 or "group_index" not in batch else batch
    answers = [tokenizer.decode([t for t in s.last_turn if t not in eos_token_ids], skip_special_tokens=True)
               for s in samples]
    texts = [tokenizer.decode(s.ids, skip_special_tokens=False) for s in samples]
    steps = [json.dumps(s.steps) for s in samples]
    segments = [json.dumps(_segment_texts(s, tokenizer)) for s in samples]
    return repeated.with_fields(**fields, responses=answers, trajectories=texts, agent_steps=steps,
                                agent_segments=segments)


def _segment_texts(sample: _Sample, tokenizer) -> list[dict[str, Any]]:
    """The trajectory as ``[{"model": bool, "text": ..., "ids": [...]}, ...]``, one entry per turn or observation."""
    out, at = [], 0
    for is_model, length in sample.segments:
        ids = sample.ids[at:at + length]
        out.append({"model": is_model, "text": tokenizer.decode(ids, skip_special_tokens=False), "ids": ids})
        at += length
    return out
