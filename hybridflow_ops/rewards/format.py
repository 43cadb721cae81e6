"""Format reward: does the response follow a required layout (by default ``<think>..</think><answer>..</answer>``)?

The default layout is one ``<think>`` block, then one ``<answer>`` block, with
only whitespace around and between them and no nested or repeated tags of the
same name inside either block (so ``<think>a</think><answer>b</answer><answer>c</answer>``
fails). Any other layout is a regular expression passed as ``pattern``, matched
against the whole stripped response with ``re.DOTALL``.
"""
from __future__ import annotations

import re

__all__ = ["THINK_ANSWER", "compute_score"]

THINK_ANSWER = re.compile(
    r"<think>(?:(?!</?think>).)*</think>\s*<answer>(?:(?!</?answer>).)*</answer>", re.DOTALL)
"""One think block then one answer block, whitespace only between them."""


def compute_score(data_source: str, solution_str: str, ground_truth=None, extra_info: dict | None = None, *,
                  pattern: str | re.Pattern = THINK_ANSWER) -> float:
    """1.0 when the whole stripped response matches ``pattern``, else 0.0 (``ground_truth`` is unused)."""
    regex = pattern if isinstance(pattern, re.Pattern) else re.compile(pattern, re.DOTALL)
    return 1.0 if regex.fullmatch(solution_str.strip()) else 0.0
