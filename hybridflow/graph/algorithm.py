"""``@hybridflow.algorithm``: an RL algorithm written as a traced Python function.

::

    @hf.algorithm
    def grpo(prompts, actor, reward, *, n=8, clip_ratio=0.2):
        rollout = actor.generate(prompts, n=n)
        ...

The function's positional parameters are graph inputs (``prompts``) and
roles; a role's model kind comes from its name (:data:`ROLE_KINDS_BY_NAME`)
or from ``@hf.algorithm(roles={"judge": "reward"})``; ``roles={"reward": "rule"}``
says the reward is a rule function (no model: the compiler costs it as ~0). Its keyword-only
parameters are the graph attributes: ``grpo.build(n=4)`` traces the function
with ``n=4`` and records ``n`` among the graph's attributes. Attributes that
change the graph's structure (an ``if`` on ``kl_as_loss``) are resolved here,
in Python, because graph variants are different graphs.

Roles the traced function never uses are left out of the graph, so a variant
that does not need a reference model does not ask for one.

``@hf.algorithm(state=(rule, ...))`` declares run state that the trainer updates
after each step and feeds to compute nodes (:mod:`.state`), e.g. Safe-RLHF's
Lagrange multiplier.
"""
from __future__ import annotations

import functools
import inspect
from typing import Callable, Mapping

from ..errors import TraceError
from .attrs import is_scalar, make_params
from .ir import TRAINABLE_KINDS, Graph, GraphInput, Role
from .schema import PROMPTS, Schema
from .state import StateRule
from .trace import RoleHandle, Tracer
from .validate import validate

__all__ = ["Algorithm", "algorithm", "ROLE_KINDS_BY_NAME", "GRAPH_INPUTS"]

ROLE_KINDS_BY_NAME: dict[str, str] = {
    "actor": "policy", "critic": "critic", "ref": "reference", "reward": "reward",
    "cost": "cost", "cost_critic": "critic",
}
"""The model kind of a role parameter, by its name; other names are declared with ``roles=``."""

GRAPH_INPUTS: dict[str, Schema] = {"prompts": PROMPTS}
"""Positional parameters with these names are graph inputs, not roles."""


RULE_SHORTHAND = "rule"
"""``roles={"reward": "rule"}``: a reward role computed by a rule function (a ``cost`` role: ``"cost:rule"``)."""


def _role(name: str, kind: "str | Role") -> Role:
    if isinstance(kind, Role):
        return kind
    if kind == RULE_SHORTHAND:
        return Role(name=name, kind="reward", trainable=False, rule=True)
    if isinstance(kind, str) and kind.endswith(":" + RULE_SHORTHAND):
        return Role(name=name, kind=kind.rsplit(":", 1)[0], trainable=False, rule=True)
    return Role(name=name, kind=kind, trainable=kind in TRAINABLE_KINDS)


class Algorithm:
    """A traceable algorithm; :meth:`build` makes its :class:`Graph`."""

    def __init__(self, fn: Callable, name: str | None = None, roles: Mapping[str, "str | Role"] | None = None,
                 state: tuple[StateRule, ...] = ()):
        self.fn, self.name = fn, name or fn.__name__
        functools.update_wrapper(self, fn)
        declared = dict(roles or {})
        self.inputs: list[GraphInput] = []
        self.roles: dict[str, Role] = {}
        self.defaults: dict[str, object] = {}
        for param in inspect.signature(fn).parameters.values():
            self._add_parameter(param, declared)
        unknown = sorted(set(declared) - set(self.roles))
        if unknown:
            raise TraceError(f"algorithm {self.name!r}: roles={unknown} are declared but are not parameters of the function")
        self.state = tuple(state)
        for rule in self.state:
            missing = [a for a in (rule.name, *rule.hyper) if a not in self.defaults]
            if missing:
                raise TraceError(f"algorithm {self.name!r}: state {rule.name!r} reads attribute(s) {missing}, which are "
                                 "not keyword-only parameters of the function")

    def _add_parameter(self, param: inspect.Parameter, declared: dict) -> None:
        where = f"algorithm {self.name!r}, parameter {param.name!r}"
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TraceError(f"{where}: *args / **kwargs cannot be traced; name every role and attribute")
        if param.kind is param.KEYWORD_ONLY:
            if param.default is param.empty or not is_scalar(param.default):
                raise TraceError(f"{where}: a graph attribute needs a default that is a JSON scalar (None, bool, int, float, str), got {param.default!r}")
            self.defaults[param.name] = param.default
        elif param.name in GRAPH_INPUTS:
            self.inputs.append(GraphInput(param.name, GRAPH_INPUTS[param.name]))
        elif param.name in declared or param.name in ROLE_KINDS_BY_NAME:
            self.roles[param.name] = _role(param.name, declared.get(param.name, ROLE_KINDS_BY_NAME.get(param.name, "")))
        else:
            raise TraceError(
                f"{where} is neither a graph input ({', '.join(GRAPH_INPUTS)}) nor a role with a known kind "
                f"({', '.join(ROLE_KINDS_BY_NAME)}); declare it with @hybridflow.algorithm(roles={{{param.name!r}: 'critic'}}) "
                "or make it keyword-only (after *) to use it as an attribute"
            )

    def trace(self, **overrides: object) -> Graph:
        """The graph with ``overrides`` of the default attributes, not yet validated."""
        unknown = sorted(set(overrides) - set(self.defaults))
        if unknown:
            raise TraceError(f"algorithm {self.name!r} has no attribute {', '.join(unknown)}; its attributes are {', '.join(self.defaults) or '(none)'}")
        attrs = {**self.defaults, **overrides}
        params = make_params(attrs, f"algorithm {self.name!r}")
        with Tracer(self.name, self.roles, tuple(self.inputs)) as tracer:
            args = [tracer.input_value(i) if isinstance(i, GraphInput) else RoleHandle(tracer, i)
                    for i in self._positional()]
            result = self.fn(*args, **attrs)
        if result is not None:
            raise TraceError(f"algorithm {self.name!r} returned {result!r}; an algorithm returns nothing (its updates are its effect)")
        return tracer.graph(params)

    def _positional(self) -> list:
        inputs = {i.name: i for i in self.inputs}
        return [inputs.get(p.name) or self.roles[p.name] for p in inspect.signature(self.fn).parameters.values()
                if p.kind is not p.KEYWORD_ONLY]

    def build(self, **overrides: object) -> Graph:
        """Trace and validate: ``ppo.build(kl_coef=0.01)``; warnings (unused values) are issued, not raised."""
        graph = self.trace(**overrides)
        validate(graph)
        return graph

    def __call__(self, *args, **kwargs):
        raise TraceError(f"algorithm {self.name!r} is not called directly; make its graph with {self.name}.build(**attributes)")

    def __repr__(self) -> str:
        return f"<algorithm {self.name}({', '.join(p.name for p in self._positional())}; {', '.join(f'{k}={v!r}' for k, v in self.defaults.items())})>"


def algorithm(fn: Callable | None = None, *, name: str | None = None, roles: Mapping[str, "str | Role"] | None = None,
              state: tuple[StateRule, ...] = ()):
    """Decorator: ``@algorithm`` or ``@algorithm(name=..., roles={"judge": "reward"}, state=(rule,))``."""
    if fn is None:
        return lambda f: Algorithm(f, name=name, roles=roles, state=state)
    return Algorithm(fn, name=name, roles=roles, state=state)
