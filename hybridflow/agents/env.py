"""The environment interface of multi-turn rollouts, and the registry that names environments.

An environment is the other side of a conversation with the policy::

    observation = env.reset(prompt)                 # prompt: the dataset row (prompt, ground_truth, extra_info, ...)
    observation, reward, done, info = env.step(action)   # action: the text of the model's last turn

The rollout loop (:mod:`hybridflow.runtime.engines.agent_loop`) calls ``reset`` once per sample,
then alternates a model turn and ``step`` until ``done``, ``max_turns`` or the token budget. An
observation is text; the loop tokenises it once and appends it to the trajectory as tokens the
loss never sees. ``reward`` is summed over a sample's steps into ``env_reward``; ``info`` may
hold ``tool_calls`` and ``tool_errors`` counts (ints), which the loop sums too.

Environments are classes (or factories) called with no arguments, one instance per sample, so
an environment keeps per-sample state on ``self``. They are named like custom algorithms:

====================================  ===================================================
``"calc"``                            the built-in of that name (:data:`ENVIRONMENTS`)
``"package.module:Class"``            that module's class or factory
a class / factory                     itself
====================================  ===================================================
"""
from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Callable, Mapping, NamedTuple, Protocol, runtime_checkable

from ..errors import AgentError

__all__ = ["StepResult", "Environment", "ENVIRONMENTS", "register_env", "resolve_env", "env_choices"]


class StepResult(NamedTuple):
    """What :meth:`Environment.step` returns (a plain 4-tuple is accepted too)."""

    observation: str
    """Text shown to the model before its next turn ("" for none)."""
    reward: float
    """Reward of this step; the rollout's ``env_reward`` is the sum over steps."""
    done: bool
    """The episode is over: the loop stops this sample."""
    info: Mapping[str, Any]
    """Anything else; ``tool_calls`` / ``tool_errors`` (ints) are counted by the loop."""


@runtime_checkable
class Environment(Protocol):
    """One episode's environment; see the module docstring."""

    def reset(self, prompt: Mapping[str, Any]) -> str:
        ...

    def step(self, action: str) -> "StepResult | tuple[str, float, bool, Mapping[str, Any]]":
        ...


EnvFactory = Callable[[], Environment]

ENVIRONMENTS: dict[str, EnvFactory] = {}
"""Built-in and registered environments by name (``register_env``)."""


def register_env(name: str) -> Callable[[EnvFactory], EnvFactory]:
    """Class decorator: ``@register_env("calc")`` makes ``env="calc"`` build this class."""
    if not isinstance(name, str) or not name.isidentifier():
        raise AgentError(f"register_env: environment name {name!r} must be an identifier")

    def add(factory: EnvFactory) -> EnvFactory:
        ENVIRONMENTS[name] = factory
        return factory

    return add


def env_choices() -> str:
    _load_builtins()
    return f"choose one of {', '.join(sorted(ENVIRONMENTS)) or '(none)'} or 'package.module:Class'"


def _load_builtins() -> None:
    from . import calc_env  # noqa: F401  (registers "calc" and "calc_python")


def resolve_env(spec: object, where: str = "env") -> EnvFactory:
    """The environment factory ``spec`` names (module docstring); AgentError saying what is accepted."""
    if callable(spec) and not isinstance(spec, str):
        return spec  # type: ignore[return-value]
    if not isinstance(spec, str) or not spec.strip():
        raise AgentError(f"{where}: {spec!r} is not an environment; {env_choices()}")
    text = spec.strip()
    _load_builtins()
    if text in ENVIRONMENTS:
        return ENVIRONMENTS[text]
    if ":" not in text:
        raise AgentError(f"{where}: unknown environment {text!r}; {env_choices()}")
    module_name, _, attr = text.partition(":")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise AgentError(f"{where} {text!r}: cannot import module {module_name!r} ({err})") from None
    found = getattr(module, attr, None)
    if found is None or not callable(found):
        raise AgentError(f"{where} {text!r}: module {module_name!r} has no class or factory {attr!r}")
    return found


def as_step_result(result: object, env: object) -> StepResult:
    """A step's return value as a :class:`StepResult`; AgentError naming the environment if malformed."""
    if isinstance(result, tuple) and len(result) == 4:
        observation, reward, done, info = result
        if isinstance(observation, str) and isinstance(done, bool) and isinstance(info, Mapping):
            try:
                return StepResult(observation, float(reward), done, info)
            except (TypeError, ValueError):
                pass
    raise AgentError(f"environment {type(env).__name__}.step must return (observation: str, reward: float, "
                     f"done: bool, info: dict), got {result!r}")
