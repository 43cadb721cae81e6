"""Tools an environment lets the model call, by name; the built-in safe calculator.

A tool is a callable ``tool(arguments: str) -> ToolResult``. It must not raise on bad
arguments: a bad expression, a program that crashes or loops, is a result with ``error``
set, which the environment shows to the model. :data:`TOOLS` holds the built-ins
(``calc``, ``python``) and whatever :func:`register_tool` adds.
"""
from __future__ import annotations

import ast
import math
import operator
from fractions import Fraction
from typing import Callable, Mapping, NamedTuple

from ..errors import AgentError

__all__ = ["ToolResult", "Tool", "TOOLS", "register_tool", "get_tool", "calculator"]


class ToolResult(NamedTuple):
    output: str
    """What the model reads (already truncated by the tool)."""
    error: str | None = None
    """Why the call failed (None: it succeeded); ``output`` then holds the error text shown."""
    limit: str | None = None
    """The limit that stopped the call (``cpu``, ``wall``, ``memory``, ``processes``, ``output``, ``network``,
    ``filesystem``), for sandboxed tools."""
    elapsed_s: float = 0.0


Tool = Callable[[str], ToolResult]

TOOLS: dict[str, Tool] = {}
"""Tools by name."""


def register_tool(name: str) -> Callable[[Tool], Tool]:
    """``@register_tool("calc")``: a function ``(arguments: str) -> ToolResult`` callable as ``[calc: ...]``."""
    if not isinstance(name, str) or not name.isidentifier():
        raise AgentError(f"register_tool: tool name {name!r} must be an identifier")

    def add(tool: Tool) -> Tool:
        TOOLS[name] = tool
        return tool

    return add


def get_tool(name: str) -> Tool:
    if name == "python" and name not in TOOLS:
        from . import sandbox  # noqa: F401  (registers "python")
    if name not in TOOLS:
        raise AgentError(f"unknown tool {name!r}; registered tools: {', '.join(sorted(TOOLS)) or '(none)'}")
    return TOOLS[name]


# -- the calculator: arithmetic on exact fractions, parsed with ast, nothing evaluated ------------------------

_BINARY: Mapping[type, Callable] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_UNARY: Mapping[type, Callable] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
MAX_DIGITS = 100


class _CalcError(Exception):
    pass


def _value(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        if isinstance(node.value, float) and not math.isfinite(node.value):
            raise _CalcError("not a finite number")
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise _CalcError("division by zero")
        if isinstance(node.op, ast.Pow) and (right.denominator != 1 or abs(right) > MAX_EXPONENT):
            raise _CalcError(f"exponent must be an integer of at most {MAX_EXPONENT}")
        result = _BINARY[type(node.op)](left, right)
        if max(abs(result.numerator), result.denominator).bit_length() > MAX_DIGITS * 3.33:
            raise _CalcError(f"result has more than {MAX_DIGITS} digits")
        return Fraction(result)
    raise _CalcError(f"only numbers, + - * / // % ** and parentheses are allowed (found {type(node).__name__})")


def _format(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    return repr(round(float(value), 10))


@register_tool("calc")
def calculator(arguments: str) -> ToolResult:
    """Evaluate an arithmetic expression exactly (``12+34*2`` -> ``80``, ``7/2`` -> ``3.5``); never runs code.

    The expression is parsed with :mod:`ast` and only number literals, unary ``+ -``, binary
    ``+ - * / // % **`` (integer exponents up to 64) and parentheses are evaluated, on exact fractions.
    """
    text = arguments.strip()
    if len(text) > MAX_EXPRESSION_CHARS:
        return ToolResult(f"error: expression longer than {MAX_EXPRESSION_CHARS} characters", "too long")
    try:
        tree = ast.parse(text, mode="eval")
        return ToolResult(_format(_value(tree.body)))
    except SyntaxError:
        return ToolResult("error: not an arithmetic expression", "syntax")
    except (_CalcError, OverflowError, ValueError, RecursionError) as err:
        return ToolResult(f"error: {err}", str(err) or type(err).__name__)
