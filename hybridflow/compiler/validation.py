"""The validation plan: greedy and sampled generations of the policy, scored, on the training plan's pools.

Validation is work like any other, so it runs as a plan through the same
interpreter as training (not as calls into remote engines):

* :func:`validation_graph` — ``policy.generate(prompts, greedy=True)`` and
  ``policy.generate(prompts, n=samples, seed=seed)``, each scored by the reward
  role (the sampled generation has a stream of its own, so validating never
  moves training's sampler);
* :func:`validation_plan` — that graph on the training plan's pools
  (:func:`~.control.graph_plan`, the training plan's bracketing): the
  policy's generations where the training plan generates (its rollout pool, or
  its own pool), the scores on the reward's pool, after the training plan's
  weight sync of the policy, so the rollout engine samples with the weights of
  the last update (a rollout engine with a copy of the weights — a pool of
  several devices, or a rollout pool — holds the weights of the last
  generation otherwise).

The plan is bound to the training plan's machine and verified like any other.
"""
from __future__ import annotations

import inspect
import warnings

from ..errors import PlanError
from ..graph import Graph
from ..graph.errors import UnusedValueWarning
from .control import graph_plan
from .plan import ExecutionPlan

__all__ = ["validation_graph", "validation_plan"]


def validation_graph(policy: str = "actor", reward: str = "reward", *, samples: int = 4, seed: int | None = None,
                     agent: dict | None = None) -> Graph:
    """The graph of one validation: greedy and ``samples`` sampled responses per prompt, each scored.

    ``agent``: the training rollout's environment settings (``GenerateAttrs.agent``): validation then
    runs the same multi-turn rollouts, and the reward role scores their final answers.
    """
    import hybridflow as hf

    multi_turn = dict(agent or {})

    def validate(prompts, actor, scorer, *, samples, seed):
        greedy = actor.generate(prompts, greedy=True, **multi_turn)
        scorer.score(greedy)
        sampled = actor.generate(prompts, n=samples, seed=seed, **multi_turn)
        scorer.score(sampled)

    parameter = inspect.Parameter
    validate.__signature__ = inspect.Signature([
        parameter("prompts", parameter.POSITIONAL_OR_KEYWORD), parameter(policy, parameter.POSITIONAL_OR_KEYWORD),
        parameter(reward, parameter.POSITIONAL_OR_KEYWORD), parameter("samples", parameter.KEYWORD_ONLY, default=4),
        parameter("seed", parameter.KEYWORD_ONLY, default=None)])
    algorithm = hf.algorithm(validate, name="validation", roles={policy: "policy", reward: "reward"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedValueWarning)  # the scores are the result: read by the trainer
        return algorithm.build(samples=samples, seed=seed)


def validation_plan(plan: ExecutionPlan, *, samples: int = 4, seed: int | None = None) -> ExecutionPlan:
    """The validation graph of ``plan``'s policy and reward, placed and ordered on ``plan``'s pools (module docstring)."""
    train = plan.graph
    policies = [r.name for r in train.roles if r.kind == "policy"]
    rewards = [r.name for r in train.roles if r.kind == "reward"]
    if not policies or not rewards:
        raise PlanError(f"graph {train.name!r} has no policy and reward role to validate with")
    policy, reward = policies[0], rewards[0]
    agent = next((n.attrs.agent for n in train.nodes if n.kind == "generate" and n.role == policy and n.attrs.agent), None)
    graph = validation_graph(policy, reward, samples=samples, seed=seed, agent=agent)
    return graph_plan(plan, graph, after="validation_plan")
