"""GSM8K reward: the number after the last ``####`` against the reference answer.

GSM8K (Cobbe et al. 2021) solutions end with ``#### <answer>``. The response's
answer is the number that follows its last ``####`` (spaces and a ``$`` sign
allowed in between; thousands commas removed: ``#### 1,234`` is 1234). It
scores 1.0 when it equals the ground truth as a decimal number (``72``,
``72.0`` and ``72.00`` are equal), ``format_score`` when it is a number but a
wrong one, and 0.0 when the last ``####`` is missing or not followed by a
number. The ground truth may be the bare number or a whole GSM8K solution
(its number after ``####`` is used).
"""
from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

__all__ = ["compute_score"]

_MARK = "####"
_NUMBER = re.compile(r"[ \t]*\$?[ \t]*(-?[0-9][0-9,]*(?:\.[0-9]+)?)")


def extract_answer(text: str) -> Decimal | None:
    """The number right after the last ``####`` in ``text``, or None."""
    at = text.rfind(_MARK)
    if at < 0:
        return None
    found = _NUMBER.match(text, at + len(_MARK))
    if found is None:
        return None
    try:
        return Decimal(found.group(1).replace(",", ""))
    except InvalidOperation:
        return None


def _reference(ground_truth) -> Decimal:
    text = str(ground_truth)
    value = extract_answer(text) if _MARK in text else extract_answer(f"{_MARK} {text.strip()}")
    if value is None:
        raise ValueError(f"gsm8k ground_truth must be a number or a solution ending in '#### <number>', "
                         f"got {ground_truth!r}")
    return value


def compute_score(data_source: str, solution_str: str, ground_truth, extra_info: dict | None = None, *,
                  format_score: float = 0.0) -> float:
    """1.0 for the right number after the last ``####``, ``format_score`` for a wrong number, else 0.0."""
    answer = extract_answer(solution_str)
    if answer is None:
        return 0.0
    return 1.0 if answer == _reference(ground_truth) else float(format_score)
