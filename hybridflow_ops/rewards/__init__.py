"""Rule rewards: ``compute_score`` functions that grade a response's text against a ground truth.

Every function here has the signature common in this field::

    compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict

``solution_str`` is the text the model generated (EOS already stripped by the
caller), ``ground_truth`` the dataset's reference, ``extra_info`` an optional dict
from the dataset row. A dict result holds the score under ``"score"`` and any
extra per-sample values beside it. Hyper-parameters (``format_score``, ``pattern``)
are keyword-only; bind them with ``functools.partial``.

:func:`default_compute_score` dispatches on ``data_source`` through
:data:`RULE_REWARDS`. The functions are pure string work (no ``eval``, no I/O).
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Any, Callable, Mapping

from . import arithmetic, countdown, gsm8k
from . import format as format_reward

__all__ = ["RULE_REWARDS", "default_compute_score", "arithmetic", "countdown", "format_reward", "gsm8k"]

RULE_REWARDS: Mapping[str, Callable[..., Any]] = MappingProxyType({
    "arithmetic": arithmetic.compute_score,
    "agent_calc": arithmetic.compute_score,  # the final answer of a calculator-using agent (hybridflow.agents.calc_env)
    "gsm8k": gsm8k.compute_score,
    "openai/gsm8k": gsm8k.compute_score,
    "countdown": countdown.compute_score,
})
"""The rule reward of each known ``data_source`` (read-only)."""


def default_compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None):
    """Score ``solution_str`` with the rule reward registered for ``data_source`` in :data:`RULE_REWARDS`.

    Raises ``ValueError`` naming the known data sources when ``data_source`` has no rule reward.
    """
    try:
        fn = RULE_REWARDS[data_source]
    except (KeyError, TypeError):
        known = ", ".join(sorted(RULE_REWARDS))
        raise ValueError(f"no rule reward for data_source {data_source!r}; known data sources: {known}. "
                         "For another dataset pass your own compute_score(data_source, solution_str, "
                         "ground_truth, extra_info=None) to the reward source.") from None
    return fn(data_source, solution_str, ground_truth, extra_info)
