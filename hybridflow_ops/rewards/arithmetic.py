"""Exact-answer reward for integer arithmetic prompts such as ``"17+25="``.

The response is the text generated right after the prompt (EOS already
stripped). After stripping surrounding whitespace it must be exactly the
decimal digits of the ground truth, with a leading ``-`` for a negative one,
and nothing else: ``"42"``, ``" 42\\n"`` score 1 for 42; ``"042"``, ``"+42"``,
``"42."``, ``"4 2"``, ``"42 is the answer"`` and ``"-0"`` score 0.

:func:`long_answer_cost` is a *cost* with the same signature, for constrained RL
(Safe-RLHF's ``cost_fn``): 1 for a response of more than one character.
"""
from __future__ import annotations

import re

__all__ = ["compute_score", "long_answer_cost"]

_INTEGER = re.compile(r"-?[0-9]+")  # ASCII digits only (\d would accept other scripts' digits)


def _canonical(ground_truth) -> str:
    """The ground truth as its canonical decimal text (``int`` or integer string accepted)."""
    text = str(ground_truth).strip()
    if isinstance(ground_truth, bool) or not _INTEGER.fullmatch(text.lstrip("+")):
        raise ValueError(f"arithmetic ground_truth must be an integer, got {ground_truth!r}")
    return str(int(text))


def compute_score(data_source: str, solution_str: str, ground_truth, extra_info: dict | None = None) -> float:
    """1.0 when the stripped response is exactly the ground-truth integer, else 0.0."""
    return 1.0 if solution_str.strip() == _canonical(ground_truth) else 0.0


def long_answer_cost(data_source: str, solution_str: str, ground_truth=None, extra_info: dict | None = None) -> float:
    """1.0 when the stripped response is longer than one character, else 0.0 (the ground truth is not read).

    On the built-in task (``a+b=`` with ``a, b`` in 0..9) every correct answer of 10 or more
    costs 1, so 45 of the 100 prompts cannot be answered both correctly and at no cost: a cost
    limit below 0.45 makes the constraint bind, and a policy must trade reward for cost.
    """
    return 1.0 if len(solution_str.strip()) > 1 else 0.0
