"""An environment in which the model calls tools and then answers: the base of the built-in tasks.

Each ``step`` reads one model turn. A turn with a tool call (:mod:`.tool_calls`) runs the
tool and answers with its result, ``{result}`` (an error observation for a malformed call, an
unknown tool, or a tool that failed: never an exception); a turn without one is the final
answer, which :meth:`ToolEnv.score` grades, and the episode ends.
"""
from __future__ import annotations

from typing import Any, Mapping

from .env import StepResult
from .tool_calls import MalformedCall, ToolCallFormat, parse_tool_call
from .tools import Tool, ToolResult, get_tool

__all__ = ["ToolEnv"]


class ToolEnv:
    """Tools by name (``tools``), the one a call without a name runs (``default_tool``), and a grader."""

    tool_names: tuple[str, ...] = ()
    default_tool: str | None = None
    format: ToolCallFormat = ToolCallFormat()

    def __init__(self) -> None:
        self.tools: dict[str, Tool] = {name: get_tool(name) for name in self.tool_names}
        self.row: Mapping[str, Any] = {}

    @property
    def stop_strings(self) -> tuple[str, ...]:
        """A model turn ends after a tool call's closing marker (the loop stops sampling there)."""
        return (self.format.close,)

    def reset(self, prompt: Mapping[str, Any]) -> str:
        self.row = prompt
        return ""

    def score(self, answer: str) -> float:
        """The reward of a final answer; subclasses grade against ``self.row``."""
        raise NotImplementedError(f"{type(self).__name__} must define score(answer)")

    def step(self, action: str) -> StepResult:
        call = parse_tool_call(action, self.format, tuple(self.tools))
        if call is None:
            return StepResult("", self.score(action), True, {"tool_calls": 0, "tool_errors": 0})
        if isinstance(call, MalformedCall):
            return self._answer(ToolResult(f"error: {call.reason}", call.reason), None)
        name = call.name or self.default_tool
        if name not in self.tools:
            return self._answer(ToolResult("error: name a tool: " + ", ".join(self.tools), "no tool named"), name)
        try:
            result = self.tools[name](call.arguments)
        except Exception as err:  # a tool's own bug is the model's error observation, not the batch's crash
            result = ToolResult(f"error: tool {name} failed: {type(err).__name__}", repr(err))
        return self._answer(result, name)

    def _answer(self, result: ToolResult, name: str | None) -> StepResult:
        info = {"tool_calls": 1, "tool_errors": int(result.error is not None), "tool": name,
                "tool_limit": result.limit, "tool_s": round(result.elapsed_s, 4)}
        return StepResult(self.format.result(result.output), 0.0, False, info)
