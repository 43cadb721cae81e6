"""What a resumed run needs to continue bit for bit, besides the tensors: JSON.

The workers save and load every role's state themselves, as ops of a checkpoint / restore plan
(:func:`hybridflow.compiler.control.control_plan`, ``Worker.save_state`` / ``load_state``): the
tensors (each trained role's model weights and optimizer state) as DCP shards, and JSON sections
per role — ``engines`` (optimizer param groups, LR schedule, mini-batch shuffle generator, from
the pool's rank 0) and ``rollout_rng`` (the sampler's RNG, from every rank that samples). Here:
those sections merged into the checkpoint's JSON (:func:`state_sections`) and handed back to the
ops that load them (:func:`role_sections`), and the controller's global torch / numpy / python
RNGs; the trainer adds the step, the prompt loader's position, the NaN-streak counter, the
algorithm's run state (e.g. Safe-RLHF's Lagrange multiplier; see :mod:`.algorithm_state`), and
the config with its hash. Byte states (generators) are base64 strings.
"""
from __future__ import annotations

import random
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from ..runtime.byte_state import state_from_text, state_to_text

__all__ = ["ROLE_SECTIONS", "state_sections", "role_sections", "capture_json", "restore", "rng_state", "set_rng_state"]

ROLE_SECTIONS = ("engines", "rollout_rng")
"""The checkpoint's per-role sections (section -> role -> state), as the workers' ``save_state`` returns them."""


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


# -- the workers' sections ------------------------------------------------------------------------

def state_sections(op_roles: Mapping[str, str], results: Mapping[str, Sequence[Mapping[str, Any]]]
                   ) -> tuple[dict[str, dict[str, Any]], dict[str, dict]]:
    """The checkpoint's role sections and the shards' manifest entries from a save plan's results (op name ->
    its slots' sections in rank order; ``op_roles``: op name -> role). A section one slot returned is stored as
    it is; one several ranks returned (a data-parallel sampler's RNG) as ``{"ranks": [rank 0's, rank 1's, ...]}``."""
    sections: dict[str, dict[str, Any]] = {name: {} for name in ROLE_SECTIONS}
    manifest: dict[str, dict] = {}
    for op, ranks in results.items():
        for name in ROLE_SECTIONS:
            values = [r[name] for r in ranks if name in r]
            if values:
                sections[name][op_roles[op]] = values[0] if len(values) == 1 else {"ranks": values}
        for r in ranks:
            manifest.update(r.get("manifest", {}))
    return sections, manifest


def role_sections(state: Mapping[str, Any], role: str) -> dict[str, Any]:
    """What a checkpoint holds of ``role``, section by section, for its workers' ``load_state``. Checkpoints
    written before the rollout protocol held the HF generators bare (``rollout_generators``)."""
    found = {name: state[name][role] for name in ROLE_SECTIONS if role in state.get(name, {})}
    if "rollout_rng" not in state and role in state.get("rollout_generators", {}):
        found["rollout_rng"] = {"generators": state["rollout_generators"][role]}
    return found


def capture_json(sections: Mapping[str, Any]) -> dict[str, Any]:
    """The workers' role ``sections`` (:func:`state_sections`) and the global RNGs."""
    return {**sections, "rng": rng_state()}


def restore(state: Mapping[str, Any]) -> None:
    """Load the controller's part of a captured state: the global RNGs (the workers load the roles' sections)."""
    set_rng_state(state["rng"])
