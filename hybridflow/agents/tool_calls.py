"""The tool-call format, and a parser that never raises on what a model writes.

A model's turn calls a tool by writing ``OPEN name: arguments CLOSE`` (with the default
:class:`ToolCallFormat`, ``[calc: 12+34+56]``), or ``OPEN arguments CLOSE`` to call the
environment's default tool (``[12+34+56]``). A turn without ``OPEN`` is a final answer. The
arguments run from the first ``OPEN`` to the last ``CLOSE``, so they may contain the markers;
but the rollout loop ends a turn at a one-token ``CLOSE``, so a tool whose arguments contain it
(Python code and ``]``) needs a format whose closing marker they do not (``calc_python`` uses
``<tool>...</tool>``).

:func:`parse_tool_call` returns a :class:`ToolCall`, a :class:`MalformedCall` (an opening
marker without a closing one, an empty call, text after the call) or None (no call). It never raises: whatever a model writes, the environment gets something it can
turn into an observation.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Collection

from ..errors import AgentError

__all__ = ["ToolCallFormat", "ToolCall", "MalformedCall", "parse_tool_call"]

_NAME = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*:")


@dataclass(frozen=True)
class ToolCallFormat:
    """The markers around a tool call, and around the observation that answers it."""

    open: str = "["
    close: str = "]"
    result_open: str = "{"
    result_close: str = "}"

    def __post_init__(self) -> None:
        for name in ("open", "close", "result_open", "result_close"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise AgentError(f"ToolCallFormat.{name} must be a non-empty string, got {getattr(self, name)!r}")
        if self.open == self.close:
            raise AgentError(f"ToolCallFormat: open and close markers must differ, both are {self.open!r}")

    def call(self, arguments: str, name: str | None = None) -> str:
        """The text of a call (what a model should write)."""
        return f"{self.open}{name + ':' if name else ''}{arguments}{self.close}"

    def result(self, text: str) -> str:
        """The observation text answering a call."""
        return f"{self.result_open}{text}{self.result_close}"


@dataclass(frozen=True)
class ToolCall:
    name: str | None
    """The tool named in the call; None: the environment's default tool."""
    arguments: str


@dataclass(frozen=True)
class MalformedCall:
    reason: str
    """Why the call cannot run, shown to the model as an error observation."""


def parse_tool_call(text: str, fmt: ToolCallFormat = ToolCallFormat(),
                    tool_names: Collection[str] = ()) -> "ToolCall | MalformedCall | None":
    """The tool call in one model turn (module docstring); never raises.

    ``tool_names``: the names a ``name:`` prefix may take; a prefix naming another identifier is
    part of the default tool's arguments (``[x: 3]`` is not a call of a tool ``x`` unless there is one).
    """
    if not isinstance(text, str):
        return MalformedCall(f"a turn is text, got {type(text).__name__}")
    start = text.find(fmt.open)
    if start < 0:
        return None
    end = text.rfind(fmt.close, start + len(fmt.open))
    if end < 0:
        return MalformedCall(f"tool call opened with {fmt.open!r} but never closed with {fmt.close!r}")
    body = text[start + len(fmt.open):end]
    rest = text[end + len(fmt.close):]
    if rest.strip():
        return MalformedCall(f"text after the tool call: {rest.strip()[:40]!r}; end the turn with {fmt.close!r}")
    name = None
    match = _NAME.match(body)
    if match and match.group(1) in tool_names:
        name, body = match.group(1), body[match.end():]
    if not body.strip():
        return MalformedCall("empty tool call")
    return ToolCall(name, body.strip())
