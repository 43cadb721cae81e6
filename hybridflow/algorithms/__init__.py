"""The standard RL algorithms as graphs, one file each, and the table that names them.

``ALGORITHMS["grpo"].build(n=4)`` makes GRPO's graph. A user's algorithm needs no
entry here: :func:`resolve_algorithm` takes an ``@hf.algorithm`` function, a Graph,
``"package.module:function"`` or a graph JSON file wherever a built-in name goes. Trainers for these
algorithms live alongside (added separately); this module imports only the
graph definitions.
"""
from __future__ import annotations

from ..errors import GraphError
from ..graph import Algorithm
from .agent_grpo import agent_grpo
from .cispo import cispo
from .clip_cov import clip_cov
from .dapo import dapo
from .gmpo import gmpo
from .gpg import gpg
from .grpo import grpo
from .grpo_decoupled import grpo_decoupled
from .grpo_is import grpo_is
from .gspo import gspo
from .kl_cov import kl_cov
from .opo import opo
from .passk import passk
from .ppo import ppo
from .reinforce_pp import reinforce_pp
from .remax import remax
from .resolve import FixedGraph, import_modules, resolve_algorithm
from .rloo import rloo
from .safe_rlhf import safe_rlhf

__all__ = ["ALGORITHMS", "get_algorithm", "resolve_algorithm", "import_modules", "FixedGraph", "ppo", "grpo", "grpo_is", "grpo_decoupled", "rloo", "reinforce_pp", "remax", "safe_rlhf",
           "dapo", "gspo", "cispo", "gmpo", "clip_cov", "kl_cov", "opo", "gpg", "passk", "agent_grpo",
           "PPOTrainer", "GRPOTrainer", "RLOOTrainer", "ReinforcePPTrainer", "ReMaxTrainer", "SafeRLHFTrainer"]

_TRAINERS = ("PPOTrainer", "GRPOTrainer", "RLOOTrainer", "ReinforcePPTrainer", "ReMaxTrainer", "SafeRLHFTrainer")


def __getattr__(name: str):
    """The trainers (``from hybridflow.algorithms import GRPOTrainer``), imported on first use."""
    if name in _TRAINERS:
        from .. import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module 'hybridflow.algorithms' has no attribute {name!r}")

ALGORITHMS: dict[str, Algorithm] = {
    "ppo": ppo, "grpo": grpo, "grpo_is": grpo_is, "grpo_decoupled": grpo_decoupled, "rloo": rloo, "reinforce_pp": reinforce_pp, "remax": remax, "safe_rlhf": safe_rlhf,
    "dapo": dapo, "gspo": gspo, "cispo": cispo, "gmpo": gmpo, "clip_cov": clip_cov, "kl_cov": kl_cov, "opo": opo,
    "gpg": gpg, "passk": passk, "agent_grpo": agent_grpo,
}
"""Algorithm name -> its traceable definition."""


def get_algorithm(name: str) -> Algorithm:
    """The standard algorithm called ``name``; GraphError listing the known names otherwise."""
    try:
        return ALGORITHMS[name]
    except (KeyError, TypeError):
        raise GraphError(f"unknown algorithm {name!r}; the standard algorithms are {', '.join(ALGORITHMS)}") from None
