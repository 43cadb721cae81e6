"""``<loss>_is``: every policy-gradient loss with importance weights from a rollout correction.

Each policy-gradient loss function takes an optional trailing tensor ``is_weights``
(detached weights or a 0/1-masked weight, from :func:`~hybridflow_ops.truncated_is_weight`,
:func:`~hybridflow_ops.sequence_is_weight`, :func:`~hybridflow_ops.icepop_is_weight`,
:func:`~hybridflow_ops.decoupled_is_weight`, ...). The plain op (``gspo``) is registered
without it; this module registers the same function a second time as ``gspo_is``, declaring
``is_weights`` as a fifth input, so that a graph puts a correction in front of any loss by
naming the ``_is`` op:

    weights = hf.compute("truncated_is_weight", old_logp, rollout)
    actor.update(rollout, adv, old_logp, weights, loss="gspo_is")

How each loss uses the weight is in its own docstring: the per-token loss is multiplied by
``sg[w_t]`` for all of them except GMPO, whose sequence loss is multiplied by the geometric
mean of its tokens' weights. These are the rules of verl's policy losses with
``rollout_is_weights`` (``verl/trainer/ppo/core_algos.py``). The ``_is`` ops are declared
corrections in the registry (``correction=``), so :mod:`hybridflow.graph.staleness` accepts
them as what reaches a loss on lagged data only through the weights they read.
Reference: Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL
Training" (blog): importance weights applied to the policy loss.
"""
from __future__ import annotations

import inspect
from typing import Callable

from ..registry import FieldSpec, get_op, register_op

__all__ = ["IS_WEIGHTED_LOSSES", "is_weighted_name", "ppo_clip_is", "gspo_is", "gmpo_is", "cispo_is", "reinforce_is",
           "gpg_is", "dro_is", "clip_cov_is", "kl_cov_is", "sapo_is", "dppo_tv_is", "dppo_kl_is"]

IS_WEIGHTED_LOSSES = ("ppo_clip", "gspo", "gmpo", "cispo", "reinforce", "gpg", "dro", "clip_cov", "kl_cov", "sapo",
                      "dppo_tv", "dppo_kl")
"""The policy-gradient losses that take ``is_weights``; each has a ``<name>_is`` op."""

_IS_WEIGHTS = FieldSpec.parse("is_weights: float32[B, R]")


def is_weighted_name(loss: str) -> str:
    """The op name of ``loss`` reading IS weights (``"gspo"`` -> ``"gspo_is"``)."""
    return f"{loss}_is"


def _register_is_variant(base_name: str) -> Callable:
    """Register ``<base_name>_is``: the base loss's function with ``is_weights`` declared as its last input."""
    base = get_op(base_name)
    fn = base.fn
    signature = inspect.signature(fn)
    if "is_weights" not in signature.parameters:
        raise TypeError(f"loss {base_name!r} takes no is_weights parameter; add a trailing 'is_weights=None' tensor")
    params = [p.replace(default=p.empty) if p.name == "is_weights" else p for p in signature.parameters.values()]

    def variant(*args, **kwargs):
        return fn(*args, **kwargs)

    name = is_weighted_name(base_name)
    variant.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    variant.__name__ = variant.__qualname__ = name
    variant.__module__ = __name__
    first_line = (inspect.getdoc(fn) or "").splitlines()[0]
    variant.__doc__ = (
        f"``{base_name}`` with detached importance weights ``is_weights`` ``(b, r)`` from a rollout correction.\n\n"
        f"{base_name}: {first_line}\n\n"
        f"The same function as :func:`~hybridflow_ops.{base_name}` called with ``is_weights``; how the weight enters\n"
        f"the loss is in that docstring's ``is_weights`` paragraph.\n"
        "Reference: Yao et al. 2025, \"Your Efficient RL Framework Secretly Brings You Off-Policy RL Training\" (blog)."
    )
    register_op(
        name, model_inputs=base.model_inputs, inputs=base.inputs + (_IS_WEIGHTS,), outputs=base.outputs, kind="loss",
        vanishes_with=base.vanishes_with, finite=base.finite_outputs, ratio_input=base.ratio_input,
        correction=f"applies importance weights (is_weights) to the {base_name} loss",
    )(variant)
    return variant


ppo_clip_is = _register_is_variant("ppo_clip")
gspo_is = _register_is_variant("gspo")
gmpo_is = _register_is_variant("gmpo")
cispo_is = _register_is_variant("cispo")
reinforce_is = _register_is_variant("reinforce")
gpg_is = _register_is_variant("gpg")
dro_is = _register_is_variant("dro")
clip_cov_is = _register_is_variant("clip_cov")
kl_cov_is = _register_is_variant("kl_cov")
sapo_is = _register_is_variant("sapo")
dppo_tv_is = _register_is_variant("dppo_tv")
dppo_kl_is = _register_is_variant("dppo_kl")
