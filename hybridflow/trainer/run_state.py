"""What a resumed run needs to continue bit for bit, besides the tensors: JSON, captured on the controller.

Tensors (each trained role's model weights and optimizer state) are written and read by the
workers that hold them (:mod:`hybridflow.runtime.train_state`), which also return the JSON of
their engines (optimizer param groups, LR schedule, mini-batch shuffle generator). Here: the
sampling randomness of every rollout engine (its ``rng_state()``), the global torch / numpy /
python RNGs; the trainer adds the step, the prompt loader's position, the NaN-streak counter, the
algorithm's run state (e.g. Safe-RLHF's Lagrange multiplier; see :mod:`.algorithm_state`), and
the config with its hash. Byte states (generators) are base64 strings.
"""
from __future__ import annotations

import random
from typing import Any, Mapping

import numpy as np
import torch

from ..runtime.byte_state import state_from_text, state_to_text

__all__ = ["capture_json", "restore", "rng_state", "set_rng_state"]


# -- global RNGs ------------------------------------------------------------------------------

def rng_state() -> dict[str, Any]:
    """torch (CPU and CUDA), numpy and python RNG states, JSON-ready."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    state = {"torch": state_to_text(torch.get_rng_state()),
             "numpy": {"kind": kind, "keys": keys.tolist(), "pos": int(pos), "has_gauss": int(has_gauss),
                       "cached_gaussian": float(gauss)},
             "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next}}
    if torch.cuda.is_available():
        state["cuda"] = [state_to_text(s) for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    torch.set_rng_state(state_from_text(state["torch"]))
    n = state["numpy"]
    np.random.set_state((n["kind"], np.asarray(n["keys"], dtype=np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["internal"]), p["gauss_next"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([state_from_text(s) for s in state["cuda"]])


# -- engines ----------------------------------------------------------------------------------

def capture_json(engines: Mapping[str, Any], rollouts: Mapping[str, Any]) -> dict[str, Any]:
    """``engines`` (role -> the JSON state its workers returned), the RNG state of ``rollouts``, the global RNGs."""
    return {"engines": dict(engines), "rollout_rng": {role: r.rng_state() for role, r in rollouts.items()},
            "rng": rng_state()}


def _rollout_rng(state: Mapping[str, Any], role: str) -> Mapping[str, Any]:
    """A role's rollout RNG state; checkpoints written before the rollout protocol held the HF generators bare."""
    if "rollout_rng" in state:
        return state["rollout_rng"].get(role, {})
    return {"generators": state.get("rollout_generators", {}).get(role, {})}


def restore(rollouts: Mapping[str, Any], state: Mapping[str, Any]) -> None:
    """Load a captured state into the rollout engines' generators and the global RNGs (the train engines are
    loaded by their workers)."""
    for role, rollout in rollouts.items():
        saved = _rollout_rng(state, role)
        # A data-parallel rollout on Ray saved one state per rank ({"ranks": [...]}); streams are keyed by seed,
        # so every engine is given all of them and continues the ones it samples with, whatever the dp size now.
        for part in saved.get("ranks", [saved]):
            rollout.set_rng_state(part)
    set_rng_state(state["rng"])
