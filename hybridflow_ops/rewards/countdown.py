"""Countdown reward: an arithmetic equation over given numbers that must hit a target.

``ground_truth`` is ``{"target": int, "numbers": [int, ...]}`` (a dict or its JSON text).
The equation is the text of the last ``<answer>...</answer>`` block of the response,
or its last non-empty line when there is no such block. The rule used here:

* well formed: at most 256 characters, only ASCII digits, ``+ - * / ( )`` and
  whitespace, parsing as binary ``+ - * /`` over integer literals (no unary minus,
  ``**``, ``//``, ``=`` or leading zeros), and every literal one of the given numbers,
  each given number used **at most once** (a multiset subset: with numbers
  ``[3, 3, 5]`` one may write ``3*3`` but not ``5*5``; not every number must appear);
* correct: well formed and its exact rational value is within 1e-6 of the target.

Scores: 1.0 correct; ``format_score`` (default 0.1) for a well-formed equation with a
wrong value; 0.0 otherwise, including division by zero and any string that is not an
equation (``__import__('os')`` is rejected by the character check before parsing).
The equation is evaluated by walking its ``ast`` with exact ``Fraction`` arithmetic,
never with ``eval``.
"""
from __future__ import annotations

import ast
import json
import operator
import re
from collections import Counter
from fractions import Fraction

__all__ = ["compute_score", "extract_equation", "evaluate_equation"]

MAX_CHARS = 256
_ALLOWED = re.compile(r"[0-9+\-*/()\s]+")
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


class _Malformed(Exception):
    """The text is not an equation of the allowed form."""


def extract_equation(solution_str: str) -> str:
    """The last ``<answer>`` block's text, else the last non-empty line, stripped ("" when none)."""
    blocks = _ANSWER.findall(solution_str)
    if blocks:
        return blocks[-1].strip()
    lines = [line.strip() for line in solution_str.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _literals(node: ast.AST, used: list[int]) -> None:
    """Check ``node`` is binary + - * / over int literals; collect the literals in ``used``."""
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        _literals(node.left, used)
        _literals(node.right, used)
    elif isinstance(node, ast.Constant) and type(node.value) is int:
        used.append(node.value)
    else:
        raise _Malformed(type(node).__name__)


def _value(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant):
        return Fraction(node.value)
    return _OPS[type(node.op)](_value(node.left), _value(node.right))  # ZeroDivisionError propagates


def evaluate_equation(equation: str, numbers: list[int]) -> Fraction | None:
    """The exact value of a well-formed ``equation`` over ``numbers`` (see the module rule), or None.

    None when it is malformed, uses a number not given or more often than given, or divides by zero.
    """
    if len(equation) > MAX_CHARS or not _ALLOWED.fullmatch(equation):
        return None
    try:
        tree = ast.parse(equation.strip(), mode="eval")
        used: list[int] = []
        _literals(tree.body, used)
    except (SyntaxError, ValueError, RecursionError, MemoryError, _Malformed):
        return None
    if Counter(used) - Counter(numbers):  # some literal used more often than given (or not given at all)
        return None
    try:
        return _value(tree.body)
    except (ZeroDivisionError, RecursionError):
        return None


def _parse_ground_truth(ground_truth) -> tuple[int, list[int]]:
    data = json.loads(ground_truth) if isinstance(ground_truth, (str, bytes)) else ground_truth
    try:
        target, numbers = data["target"], list(data["numbers"])
        if not all(type(x) is int for x in [target, *numbers]):
            raise TypeError
    except (KeyError, TypeError):
        raise ValueError('countdown ground_truth must be {"target": int, "numbers": [int, ...]} '
                         f"(a dict or JSON text), got {ground_truth!r}") from None
    return target, numbers


def compute_score(data_source: str, solution_str: str, ground_truth, extra_info: dict | None = None, *,
                  format_score: float = 0.1) -> float:
    """1.0 when the equation reaches the target, ``format_score`` when well formed but wrong, else 0.0."""
    target, numbers = _parse_ground_truth(ground_truth)
    value = evaluate_equation(extract_equation(solution_str), numbers)
    if value is None:
        return 0.0
    return 1.0 if abs(value - target) <= Fraction(1, 10**6) else float(format_score)
