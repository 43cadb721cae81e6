"""The built-in tool environments: ``calc`` (a calculator) and ``calc_python`` (a calculator and a Python sandbox).

Both grade the final answer with the arithmetic rule reward (1 for exactly the ground-truth
integer, else 0), the same function that scores the ``agent_calc`` data source, so the
rollout's ``env_reward`` and a reward role's score agree.
"""
from __future__ import annotations

from hybridflow_ops.rewards import arithmetic

from .env import register_env
from .tool_calls import ToolCallFormat
from .tool_env import ToolEnv

__all__ = ["CalcEnv", "CalcPythonEnv"]


@register_env("calc")
class CalcEnv(ToolEnv):
    """``[12+34+56]`` (or ``[calc: ...]``) returns ``{102}``; a turn without a call is the answer."""

    tool_names = ("calc",)
    default_tool = "calc"

    def score(self, answer: str) -> float:
        return arithmetic.compute_score(str(self.row.get("data_source", "")), answer, self.row["ground_truth"])


@register_env("calc_python")
class CalcPythonEnv(CalcEnv):
    """``<tool>python: print(...)</tool>`` runs a program in the sandbox, ``<tool>12*3</tool>`` the calculator;
    results come back as ``<result>...</result>``."""

    tool_names = ("calc", "python")
    format = ToolCallFormat(open="<tool>", close="</tool>", result_open="<result>", result_close="</result>")
