"""What a resumed run needs to continue bit for bit, split into tensors (DCP) and JSON.

Tensors: each trained role's model weights and optimizer state. JSON: the step, the
optimizer param groups and LR schedule of each trained role, its mini-batch shuffle
generator, the sampling randomness of every rollout engine (its ``rng_state()``), the global
torch / numpy / python RNGs, the prompt loader's position, the NaN-streak counter, the
algorithm's run state (e.g. Safe-RLHF's Lagrange multiplier; see
:mod:`.algorithm_state`), and the config with its hash. Byte states (generators) are base64 strings.
"""
from __future__ import annotations

import base64
import random
from typing import Any, Mapping

import numpy as np
import torch

from ..errors import CheckpointError

__all__ = ["capture_tensors", "capture_json", "restore", "rng_state", "set_rng_state"]


def _b64(state: torch.Tensor) -> str:
    return base64.b64encode(state.numpy().tobytes()).decode("ascii")


def _unb64(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()


# -- global RNGs ------------------------------------------------------------------------------

def rng_state() -> dict[str, Any]:
    """torch (CPU and CUDA), numpy and python RNG states, JSON-ready."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    state = {"torch": _b64(torch.get_rng_state()),
             "numpy": {"kind": kind, "keys": keys.tolist(), "pos": int(pos), "has_gauss": int(has_gauss),
                       "cached_gaussian": float(gauss)},
             "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next}}
    if torch.cuda.is_available():
        state["cuda"] = [_b64(s) for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    torch.set_rng_state(_unb64(state["torch"]))
    n = state["numpy"]
    np.random.set_state((n["kind"], np.asarray(n["keys"], dtype=np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["internal"]), p["gauss_next"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_unb64(s) for s in state["cuda"]])


# -- engines ----------------------------------------------------------------------------------

def capture_tensors(trained: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """``"<role>/model/<name>"`` and ``"<role>/optim/<index>/<name>"`` tensors of each train engine in ``trained``."""
    out: dict[str, torch.Tensor] = {}
    for role, engine in trained.items():
        state = engine.state_dict()
        for name, tensor in state["model"].items():
            out[f"{role}/model/{name}"] = tensor
        for index, entry in state["optimizer"]["state"].items():
            for name, value in entry.items():
                if not isinstance(value, torch.Tensor):
                    raise CheckpointError(f"{role}: optimizer state {index}/{name} is a {type(value).__name__}, "
                                          "not a tensor; this optimizer cannot be checkpointed")
                out[f"{role}/optim/{index}/{name}"] = value
    return out


def capture_json(trained: Mapping[str, Any], rollouts: Mapping[str, Any]) -> dict[str, Any]:
    """Optimizer param groups, LR schedules and shuffle generators of ``trained``; generators of ``rollouts``."""
    engines = {}
    for role, engine in trained.items():
        state = engine.state_dict()
        engines[role] = {"param_groups": state["optimizer"]["param_groups"], "scheduler": state["scheduler"],
                         "shuffle_rng": _b64(state["shuffle_rng"])}
    return {"engines": engines, "rollout_rng": {role: r.rng_state() for role, r in rollouts.items()}, "rng": rng_state()}


def _rollout_rng(state: Mapping[str, Any], role: str) -> Mapping[str, Any]:
    """A role's rollout RNG state; checkpoints written before the rollout protocol held the HF generators bare."""
    if "rollout_rng" in state:
        return state["rollout_rng"].get(role, {})
    return {"generators": state.get("rollout_generators", {}).get(role, {})}


def _optimizer_state(role: str, tensors: Mapping[str, torch.Tensor]) -> dict[int, dict[str, torch.Tensor]]:
    prefix = f"{role}/optim/"
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        if key.startswith(prefix):
            index, name = key[len(prefix):].split("/", 1)
            state.setdefault(int(index), {})[name] = value
    return state


def restore(trained: Mapping[str, Any], rollouts: Mapping[str, Any], tensors: Mapping[str, torch.Tensor],
            state: Mapping[str, Any]) -> None:
    """Load a captured state into the engines and the global RNGs; CheckpointError if a role is missing."""
    for role, engine in trained.items():
        saved = state["engines"].get(role)
        prefix = f"{role}/model/"
        model = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
        if saved is None or not model:
            raise CheckpointError(f"the checkpoint has no state for role {role!r}; it holds {sorted(state['engines'])}")
        try:
            engine.load_state_dict({
                "model": model,
                "optimizer": {"state": _optimizer_state(role, tensors), "param_groups": saved["param_groups"]},
                "scheduler": saved["scheduler"], "shuffle_rng": _unb64(saved["shuffle_rng"])})
        except (RuntimeError, ValueError, KeyError) as err:
            raise CheckpointError(f"role {role!r}: the checkpoint does not fit this model ({err}); "
                                  "was it written by a run with another model?") from None
    for role, rollout in rollouts.items():
        rollout.set_rng_state(_rollout_rng(state, role))
    set_rng_state(state["rng"])
