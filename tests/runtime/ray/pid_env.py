"""An environment for the environment-pool tests: the calculator, each step's ``info`` saying which process ran it.

Named ``tests.runtime.ray.pid_env:PidCalcEnv``: Ray workers import it by name (the driver's working directory,
the repository root, is on their ``sys.path``).
"""
from __future__ import annotations

import os

from hybridflow.agents.calc_env import CalcEnv


class PidCalcEnv(CalcEnv):
    """:class:`~hybridflow.agents.calc_env.CalcEnv` whose steps report ``info["pid"]``, the process they ran in."""

    def step(self, action: str):
        observation, reward, done, info = super().step(action)
        return observation, reward, done, {**info, "pid": os.getpid()}


class BrokenCalcEnv(CalcEnv):
    """A calculator whose steps raise: an environment's bug, which the loop reports naming the environment."""

    def step(self, action: str):
        raise ValueError(f"broken tool on {action!r}")
