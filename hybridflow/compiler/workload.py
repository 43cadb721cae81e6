"""The work of one RL iteration, per role, in tokens: what the placement search simulates.

A :class:`Workload` is the compiler's view of an algorithm graph once the
tensors are gone: the rollout batch (:class:`GenerationWork`) and, per role
(:class:`RoleWork`), which model it runs, whether it is trained, and how many
generate / forward / score / training passes it makes over the batch. The
graph -> workload lowering (one ``RoleWork`` per role, counting its nodes by
kind) is :func:`hybridflow.compiler.passes.lower.lower_workload`; here the
record is built directly.

An iteration runs in three **stages**, in order (HybridFlow appendix C):
``generate`` (the generating role samples responses; its weights are first
moved to the generation layout), ``infer`` (every role's forward passes over
the rollout: old/ref log-probs, values, scores), then the controller's
``compute`` (advantages) and ``train`` (every trainable role's update).
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from ..errors import ConfigError
from .engine import DEFAULT_ENGINE, check_engines
from .models import ModelSpec

__all__ = ["STAGES", "GenerationWork", "RoleWork", "Workload", "BatchShape", "WorkloadPreset", "WORKLOAD_PRESETS", "workload_preset",
           "ppo_workload", "grpo_workload", "paper_workload"]

STAGES = ("generate", "infer", "train")
"""Stages of an iteration, in order; roles working in one stage on disjoint pools run concurrently."""


class GenerationWork(BaseModel):
    """The rollout batch: ``prompts x samples`` sequences of ``prompt_len + response_len`` tokens."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prompts: int = Field(ge=1, description="Prompts per iteration (global batch).")
    prompt_len: int = Field(ge=1, description="Tokens per prompt (padded length).")
    response_len: int = Field(ge=1, description="Tokens generated per response.")
    samples: int = Field(default=1, ge=1, description="Responses per prompt (n; GRPO/RLOO groups).")
    generations: int = Field(default=1, ge=1, description="Generation passes over the prompts per iteration (ReMax: 2, the sampled rollout and the greedy baseline); each is costed as a full rollout of prompts x samples.")

    @property
    def sequences(self) -> int:
        """Responses per iteration: prompts x samples."""
        return self.prompts * self.samples

    @property
    def seq_len(self) -> int:
        """Tokens per sequence: prompt_len + response_len."""
        return self.prompt_len + self.response_len


class RoleWork(BaseModel):
    """One role's model and its passes over the rollout batch per iteration."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="Role name: actor, critic, ref, reward, ...")
    model: ModelSpec = Field(description="The model this role runs.")
    trainable: bool = Field(default=False, description="The role's weights are updated (18 B/param of state) or frozen (2 B/param).")
    generates: bool = Field(default=False, description="The role samples the rollouts (the actor).")
    infer_passes: int = Field(default=0, ge=0, description="Forward passes over the batch (log-probs, values).")
    score_passes: int = Field(default=0, ge=0, description="Reward-model scoring passes over the batch.")
    train_epochs: int = Field(default=0, ge=0, description="Epochs of updates over the batch (PPO epochs); 0 for frozen roles.")
    mini_batches: int = Field(default=1, ge=1, description="Optimizer steps per epoch (batch / mini-batch size).")
    engines: tuple[str, ...] = Field(default=(DEFAULT_ENGINE,), description="Training engines the placement may choose for this role's model: 'fsdp' (ZeRO-3, what hybridflow's runtime runs) and/or 'megatron' (Megatron-core 3D parallelism with the distributed optimizer, HybridFlow's); see hybridflow.compiler.engine. A frozen model costs the same under both, so only the first is used for it.")

    def model_post_init(self, context: object) -> None:
        if self.train_epochs and not self.trainable:
            raise ConfigError(f"role {self.name!r}: train_epochs={self.train_epochs} but the role is not trainable; set trainable=True")
        object.__setattr__(self, "engines", check_engines(self.engines, f"role {self.name!r}"))

    @property
    def search_engines(self) -> tuple[str, ...]:
        """The engines worth trying: all of ``engines`` for a trainable role, the first for a frozen one."""
        return self.engines if self.trainable else self.engines[:1]


class Workload(BaseModel):
    """The roles of an algorithm and the batch they work on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    roles: tuple[RoleWork, ...] = Field(description="Every role that runs a model, in a stable order.")
    generation: GenerationWork = Field(description="The rollout batch.")
    controller_compute: bool = Field(default=True, description="The controller computes advantages between the infer and train stages.")

    def model_post_init(self, context: object) -> None:
        names = [r.name for r in self.roles]
        if len(set(names)) != len(names):
            raise ConfigError(f"workload: role names must be unique, got {names}")
        if not names:
            raise ConfigError("workload: needs at least one role")
        if sum(r.generates for r in self.roles) > 1:
            raise ConfigError("workload: at most one role generates the rollouts")

    @property
    def role_names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.roles)

    def role(self, name: str) -> RoleWork:
        """The role called ``name``."""
        for r in self.roles:
            if r.name == name:
                return r
        raise ConfigError(f"workload has no role {name!r}; roles: {', '.join(self.role_names)}")

    def with_engines(self, engines: tuple[str, ...]) -> "Workload":
        """The same workload with every role's training engines set to ``engines``."""
        return self.model_copy(update={"roles": tuple(RoleWork(**{**r.__dict__, "engines": engines}) for r in self.roles)})


def _spec(model: ModelSpec | str) -> ModelSpec:
    return ModelSpec.preset(model) if isinstance(model, str) else model


def ppo_workload(actor: ModelSpec | str, critic: ModelSpec | str | None = None, ref: ModelSpec | str | None = None,
                 reward: ModelSpec | str | None = None, *, prompts: int = 1024, prompt_len: int = 1024,
                 response_len: int = 1024, samples: int = 1, ppo_epochs: int = 1, mini_batches: int = 4) -> Workload:
    """PPO with four models: actor (generate, old log-probs, update), critic (values, update), ref (log-probs), reward (score).

    Unnamed critic/ref/reward models default to the actor's (the paper uses
    one size for all four). ``mini_batches=4`` is 1024 prompts in mini-batches
    of 256, verl's example PPO setting.
    """
    a = _spec(actor)
    return Workload(
        roles=(
            RoleWork(name="actor", model=a, trainable=True, generates=True, infer_passes=1,
                     train_epochs=ppo_epochs, mini_batches=mini_batches),
            RoleWork(name="critic", model=_spec(critic or a), trainable=True, infer_passes=1,
                     train_epochs=ppo_epochs, mini_batches=mini_batches),
            RoleWork(name="ref", model=_spec(ref or a), infer_passes=1),
            RoleWork(name="reward", model=_spec(reward or a), score_passes=1),
        ),
        generation=GenerationWork(prompts=prompts, prompt_len=prompt_len, response_len=response_len, samples=samples))


def grpo_workload(actor: ModelSpec | str, ref: ModelSpec | str | None = None, *, prompts: int = 1024,
                  prompt_len: int = 1024, response_len: int = 1024, samples: int = 5, epochs: int = 1,
                  mini_batches: int = 4) -> Workload:
    """GRPO: actor (generate ``samples`` per prompt, old log-probs, update) and ref; the reward is a rule on the controller."""
    a = _spec(actor)
    return Workload(
        roles=(
            RoleWork(name="actor", model=a, trainable=True, generates=True, infer_passes=1,
                     train_epochs=epochs, mini_batches=mini_batches),
            RoleWork(name="ref", model=_spec(ref or a), infer_passes=1),
        ),
        generation=GenerationWork(prompts=prompts, prompt_len=prompt_len, response_len=response_len, samples=samples))


class BatchShape(BaseModel):
    """The rollout batch and the update schedule of one iteration (the paper's workload by default, §8.1)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prompts: int = Field(1024, ge=1, description="Prompts per iteration (global batch).")
    prompt_len: int = Field(1024, ge=1, description="Tokens per prompt (padded length).")
    response_len: int = Field(1024, ge=1, description="Tokens generated per response.")
    epochs: int = Field(1, ge=1, description="Passes of every update node over the batch (PPO epochs).")
    mini_batches: int = Field(4, ge=1, description="Optimizer steps per epoch (batch / mini-batch size).")


class WorkloadPreset(BatchShape):
    """A batch shape with the source it is taken from."""

    source: str = Field(description="Where these numbers come from.")


WORKLOAD_PRESETS: dict[str, WorkloadPreset] = {
    "default": WorkloadPreset(
        prompts=1024, prompt_len=1024, response_len=1024, mini_batches=4,
        source="HybridFlow §8.1's batch shape (1024 prompts, 1024 + 1024 tokens) with verl's example PPO "
               "mini-batch of 256 prompts (4 optimizer steps per epoch)"),
    "paper": WorkloadPreset(
        prompts=1024, prompt_len=1024, response_len=1024, mini_batches=8,
        source="HybridFlow §8.1 exactly: 1024 prompts, 1024 prompt and 1024 response tokens, one PPO epoch "
               "of 8 update iterations"),
}
"""Named PPO workloads; ``default`` is what ``hybridflow simulate`` and :func:`paper_workload` use unless told otherwise."""


def workload_preset(name: str) -> WorkloadPreset:
    """The preset called ``name`` (``default`` or ``paper``)."""
    try:
        return WORKLOAD_PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown workload preset {name!r}; known: {', '.join(WORKLOAD_PRESETS)}") from None


def paper_workload(model: ModelSpec | str, preset: str = "default") -> Workload:
    """PPO with four roles of ``model`` on a :data:`WORKLOAD_PRESETS` batch (``default``: 1024 prompts of 1024 tokens, 1024-token responses, 4 mini-batches)."""
    p = workload_preset(preset)
    return ppo_workload(model, prompts=p.prompts, prompt_len=p.prompt_len, response_len=p.response_len,
                        ppo_epochs=p.epochs, mini_batches=p.mini_batches)
