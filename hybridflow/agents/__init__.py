"""Environments, tools and the sandbox of multi-turn (agentic) rollouts.

- :mod:`.env` — the environment interface (``reset`` / ``step``) and its registry (``env="calc"``,
  ``env="package.module:Class"``);
- :mod:`.tool_calls` — the tool-call format and its parser (malformed calls are values, not exceptions);
- :mod:`.tools` — the tool registry and the safe calculator; :mod:`.sandbox` — the ``python`` tool;
- :mod:`.tool_env` — an environment over tools; :mod:`.calc_env` — the built-in ``calc`` environments.

The rollout loop that drives them is :mod:`hybridflow.runtime.engines.agent_loop`.
"""
from .env import ENVIRONMENTS, Environment, StepResult, register_env, resolve_env
from .tool_calls import MalformedCall, ToolCall, ToolCallFormat, parse_tool_call
from .tools import TOOLS, ToolResult, calculator, get_tool, register_tool

__all__ = ["ENVIRONMENTS", "Environment", "StepResult", "register_env", "resolve_env", "MalformedCall", "ToolCall",
           "ToolCallFormat", "parse_tool_call", "TOOLS", "ToolResult", "calculator", "get_tool", "register_tool"]
