"""Checkpoint calls outside the plan: every slot holding a trained role's engine saves or loads its own shard.

Written against the executors' transport (``send`` / ``ready`` / ``wait`` / ``fetch`` of
:class:`~.interpreter.PlanExecutor`), so the LocalExecutor (calls run at once, no process group)
and the RayExecutor (one Ray call per slot, all in flight together: DCP's collectives need every
rank of the pool) run the same code. What travels back to the controller is JSON (param groups,
LR schedule, shuffle generator) and the shards' manifest entries, never a tensor.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from ..errors import CheckpointError
from .topology import Slot

if TYPE_CHECKING:
    from .interpreter import PlanExecutor

__all__ = ["train_slots", "save_train_states", "load_train_states"]


def train_slots(executor: "PlanExecutor", roles: Sequence[str]) -> dict[str, tuple[Slot, tuple[str, ...]]]:
    """Slot name -> (the slot, the roles of ``roles`` whose train engine it holds), for every slot holding one."""
    found = {}
    for slot in executor.topology.slots:
        here = tuple(r.role for r in slot.roles if r.train and r.role in roles)
        if here:
            found[slot.name] = (slot, here)
    absent = sorted(set(roles) - {r for _, here in found.values() for r in here})
    if absent:
        raise CheckpointError(f"no slot of the plan holds a train engine of role(s) {absent}")
    return found


def _call_all(executor: "PlanExecutor", calls: Mapping[str, tuple[Slot, str, tuple]], what: str) -> dict[str, Any]:
    """Start every call at once, wait for all, and return slot name -> result (a slot's failure as a project error)."""
    executor.check_running()
    refs = {name: executor.send(slot, method, *args) for name, (slot, method, args) in calls.items()}
    pending = list(refs.values())
    while pending:
        ready = executor.ready(pending)
        pending = [ref for ref, done in zip(pending, ready) if not done]
        if pending:
            executor.wait(pending, executor.poll_s)
    return {name: executor.fetch(refs[name], calls[name][0], what) for name in calls}


def save_train_states(executor: "PlanExecutor", roles: Sequence[str], folder: str | Path) -> tuple[dict[str, Any], dict[str, dict]]:
    """Every slot writes its shard of ``roles`` under ``folder/<role>``; returns (role -> JSON state, manifest
    entries relative to ``folder``), both from the pools' rank-0 slots."""
    slots = train_slots(executor, roles)
    results = _call_all(executor, {name: (slot, "save_train_states", (here, str(folder)))
                                   for name, (slot, here) in slots.items()}, f"checkpoint of {', '.join(roles)}")
    states: dict[str, Any] = {}
    manifest: dict[str, dict] = {}
    for name, (slot, _) in slots.items():
        if slot.rank == 0:
            part, entries = results[name]
            states.update(part)
            manifest.update(entries)
    return states, manifest


def load_train_states(executor: "PlanExecutor", roles: Sequence[str], folder: str | Path,
                      saved: Mapping[str, Any]) -> None:
    """Every slot loads its shard of ``roles`` from ``folder/<role>`` (DCP reshards to this plan's dp)."""
    folder = Path(folder)
    for role in roles:
        if role not in saved or not (folder / role / ".metadata").is_file():
            raise CheckpointError(f"{folder.parent}: the checkpoint has no state for role {role!r} "
                                  f"(no {folder.name}/{role}/ DCP folder, or no JSON state for it); it holds "
                                  f"{sorted(saved)}")
    slots = train_slots(executor, roles)
    _call_all(executor, {name: (slot, "load_train_states", (here, str(folder), {r: saved[r] for r in here}))
                         for name, (slot, here) in slots.items()}, f"loading the checkpoint of {', '.join(roles)}")
