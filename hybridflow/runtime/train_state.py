"""A train engine's state saved and loaded by the processes that hold it: one DCP folder per role.

Every rank of the pool calls :func:`save_train_state` at the same time with the pool's
process group; each writes its own shard (``__<rank>_0.distcp``) and the pool's rank 0
writes DCP's ``.metadata``. The tensors are

* ``model/<param name>``: the module's state dict as this engine holds it (FSDP2: DTensor
  shards, plain modules: whole tensors); of a LoRA module only the adapters (its frozen base
  weights are the model it was built from, and resume builds it again);
* ``optim/<param name>/<name>``: the optimizer state (AdamW: ``exp_avg``, ``exp_avg_sq``,
  ``step``), keyed by parameter name, not by index, so it does not depend on the layout.

Both come from ``torch.distributed.checkpoint.state_dict`` (``get_model_state_dict``,
``get_optimizer_state_dict``), whose sharded form DCP reshards on load: a folder written by
dp=2 loads at dp=1 (or 4) with :func:`load_train_state`, each rank reading only the parts of
the saved shards its own shard covers. What is not a tensor (the optimizer's param groups,
the LR schedule, the mini-batch shuffle generator) is returned as JSON for the controller's
``trainer_state.json``. No process group (the LocalExecutor): the same calls on one process.
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Mapping

import torch
import torch.distributed as dist

from ..errors import CheckpointError
from .byte_state import state_from_text, state_to_text
from .engines.lora import is_lora
from .dcp_files import dcp_exception, safe_reader, save_dcp, unwrap_dcp_error

__all__ = ["save_train_state", "load_train_state"]

MODEL, OPTIM = "model/", "optim/"


def _live_state(engine) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The engine's model and optimizer state dicts in DCP's form (an optimizer not stepped yet gets its state
    initialised by a zero-lr step: the template a load fills)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    return (get_model_state_dict(engine.module, options=_options(engine)),
            get_optimizer_state_dict(engine.module, engine.optimizer))


def _options(engine, **kwargs):
    """DCP state-dict options: a LoRA module's frozen base parameters are left out (saved and loaded: adapters only)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    lora = is_lora(engine.module)
    return StateDictOptions(ignore_frozen_params=lora, **({"strict": False} if lora else {}), **kwargs)


def _flat(model: Mapping[str, torch.Tensor], optim_state: Mapping[str, Mapping[str, Any]], role: str) -> dict[str, torch.Tensor]:
    out = {MODEL + name: tensor for name, tensor in model.items()}
    for param, entry in optim_state.items():
        for name, value in entry.items():
            if not isinstance(value, torch.Tensor):
                raise CheckpointError(f"{role}: optimizer state {param}/{name} is a {type(value).__name__}, "
                                      "not a tensor; this optimizer cannot be checkpointed")
            out[f"{OPTIM}{param}/{name}"] = value
    return out


def _dcp_kwargs(group) -> dict:
    return {"no_dist": True} if group is None or not dist.is_initialized() else {"process_group": group}


def save_train_state(engine, folder: str | Path, *, role: str, group=None) -> dict[str, Any]:
    """Write this rank's shard of ``engine``'s state to the DCP folder ``folder`` (a collective over ``group``).

    Returns the JSON part: ``param_groups`` (parameters by name), ``scheduler``, ``shuffle_rng`` (base64).
    """
    model, optim = _live_state(engine)
    tensors = {k: v.detach() for k, v in _flat(model, optim["state"], role).items()}
    save_dcp(tensors, folder, f"{folder}: writing the state of role {role!r} failed", **_dcp_kwargs(group))
    return {"param_groups": optim["param_groups"], "scheduler": engine.scheduler.state_dict(),
            "shuffle_rng": state_to_text(engine.shuffle_generator.get_state())}


def load_train_state(engine, folder: str | Path, saved: Mapping[str, Any], *, role: str, group=None) -> None:
    """Load the DCP folder ``folder`` (written at any dp) into ``engine`` as this rank's shard; ``saved`` is the JSON
    part :func:`save_train_state` returned. CheckpointError when the folder does not fit the model."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    folder = Path(folder)
    reader = safe_reader(folder)
    try:
        stored = set(reader.read_metadata().state_dict_metadata)
    except CheckpointError:
        raise
    except Exception as err:
        raise CheckpointError(f"{folder}: the state of role {role!r} is unreadable ({type(err).__name__}: {err})") from None
    model, optim = _live_state(engine)
    target = _flat(model, optim["state"], role)
    missing, extra = sorted(set(target) - stored), sorted(k for k in stored - set(target) if k.startswith(MODEL))
    if missing or extra:
        raise CheckpointError(f"role {role!r}: the checkpoint does not fit this model (missing {missing[:3]}, "
                              f"unexpected {extra[:3]}); was it written by a run with another model?")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        try:  # in place: each tensor of ``target`` (of ``model`` and ``optim``) receives its part
            dcp.load(target, storage_reader=reader, **_dcp_kwargs(group))
        except dcp_exception() as err:
            raise unwrap_dcp_error(err, f"{folder}: reading the state of role {role!r} failed") from None
    try:
        set_model_state_dict(engine.module, model, options=_options(engine))
        set_optimizer_state_dict(engine.module, engine.optimizer,
                                 {"state": optim["state"], "param_groups": [dict(g) for g in saved["param_groups"]]})
        engine.scheduler.load_state_dict(saved["scheduler"])
    except CheckpointError as err:
        raise CheckpointError(f"role {role!r}: {err}") from None
    except (RuntimeError, ValueError, KeyError) as err:
        raise CheckpointError(f"role {role!r}: the checkpoint does not fit this model ({err}); "
                              "was it written by a run with another model?") from None
    engine.shuffle_generator.set_state(state_from_text(saved["shuffle_rng"]))
