"""The workers' engines as seen from the controller: what the trainer reads and calls outside the plan.

The trainer validates with the actor's rollout engine and the reward source,
saves and restores the rollouts' sampling state (the workers write the model and
optimizer shards themselves, see runtime/train_state.py), and may swap the
reward source, all through ``executor.workers[pool].engines[role]`` — which,
for the LocalExecutor, are the engines themselves. For the RayExecutor,
:class:`RemoteWorker` / :class:`RemoteObject` stand in for them:

* calling a method runs it on the slots hosting that engine: on **every** rank
  of the pool for train engines (their state dicts gather FSDP shards, a
  collective) and for the rollout methods that change state on each rank
  (:data:`ALL_RANK_ROLLOUT_METHODS`: ``set_rng_state``, ``sleep``, ``wake``,
  ``update_weights``), on rank 0 for other rollout methods and reward sources;
  the result is rank 0's — except a rollout's ``rng_state()``, which is every
  rank's (``{"ranks": [state of rank 0, state of rank 1, ...]}``: a data-parallel
  rollout samples with a seed per rank; the trainer's restore gives every rank
  all of them, and each continues the stream of its own seed);
* reading an attribute returns its value, except that a torch module or a
  dict stays remote (``train.module.config`` fetches only the config);
* ``worker.engines[role] = engines`` installs engines built on the controller
  (e.g. a new reward source) on every slot of the pool.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
    from .executor import RayExecutor

__all__ = ["RemoteWorker", "RemoteRoleEngines", "RemoteObject"]

PARTS = ("train", "rollout", "reward")
ALL_RANK_ROLLOUT_METHODS = frozenset({"set_rng_state", "sleep", "wake", "update_weights"})


def _request(executor: "RayExecutor", pool: str, method: str, *args, all_ranks: bool) -> Any:
    """``SlotWorker.<method>(*args)`` on the pool's slots (all, or rank 0); returns rank 0's result."""
    return _on_ranks(executor, pool, method, args, all_ranks=all_ranks)[0]


def _on_ranks(executor: "RayExecutor", pool: str, method: str, args: tuple, *, all_ranks: bool = True) -> list:
    """``SlotWorker.<method>(*args)`` on the pool's slots (all, or rank 0); the results in rank order."""
    slots = executor.topology.pool_slots(pool)
    targets = slots if all_ranks else slots[:1]
    refs = {s.name: getattr(executor.actor(s), method).remote(*args) for s in targets}
    results = executor.get_all(refs, f"{method} on pool {pool!r}", executor.request_timeout_s)
    return [results[s.name] for s in targets]


def _rollout_rng_state(executor: "RayExecutor", pool: str, role: str):
    """A rollout's ``rng_state`` over the data-parallel ranks (see the module docstring)."""
    return lambda: {"ranks": _on_ranks(executor, pool, "engine_call", (role, "rollout", "rng_state", (), {}))}


class RemoteObject:
    """An engine (or an object inside one) on the slots of ``pool``, addressed by ``role``, ``part`` and ``path``."""

    def __init__(self, executor: "RayExecutor", pool: str, role: str, part: str, path: str = ""):
        object.__setattr__(self, "_where", (executor, pool, role, part, path))

    def _child(self, name: str) -> str:
        path = self._where[4]
        return f"{path}.{name}" if path else name

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        executor, pool, role, part, _ = self._where
        path = self._child(name)
        kind, value = _request(executor, pool, "engine_describe", role, part, path, all_ranks=False)
        if kind == "method" and part == "rollout" and path == "rng_state":
            return _rollout_rng_state(executor, pool, role)
        if kind == "method":
            return lambda *args, **kwargs: _request(executor, pool, "engine_call", role, part, path, args, kwargs,
                                                    all_ranks=part == "train" or (part == "rollout" and path in
                                                                                  ALL_RANK_ROLLOUT_METHODS))
        if kind in ("object", "mapping"):
            return (RemoteMapping if kind == "mapping" else RemoteObject)(executor, pool, role, part, path)
        return value

    def __repr__(self) -> str:
        _, pool, role, part, path = self._where
        return f"<remote {role}.{part}{'.' + path if path else ''} on pool {pool}>"


class RemoteMapping(RemoteObject):
    """A dict attribute of a remote engine: read on rank 0, written on every rank of the pool."""

    def _items(self) -> dict:
        executor, pool, role, part, path = self._where
        return _request(executor, pool, "engine_describe", role, part, path, all_ranks=False)[1]

    def items(self):
        return self._items().items()

    def keys(self):
        return self._items().keys()

    def values(self):
        return self._items().values()

    def __getitem__(self, key):
        return self._items()[key]

    def __iter__(self) -> Iterator:
        return iter(self._items())

    def __len__(self) -> int:
        return len(self._items())

    def __setitem__(self, key, value) -> None:
        executor, pool, role, part, path = self._where
        _request(executor, pool, "engine_setitem", role, part, path, key, value, all_ranks=True)


class RemoteRoleEngines:
    """A role's engines on one pool: ``.train``, ``.rollout``, ``.reward`` (None where the pool has none)."""

    def __init__(self, executor: "RayExecutor", pool: str, role: str, parts: dict[str, Any]):
        self.kind = parts["kind"]
        for part in PARTS:
            setattr(self, part, RemoteObject(executor, pool, role, part) if parts.get(part) else None)


class RemoteEngines:
    """``worker.engines``: role -> :class:`RemoteRoleEngines`; assigning installs engines on every slot."""

    def __init__(self, executor: "RayExecutor", pool: str):
        self._executor, self._pool = executor, pool

    def _parts(self) -> dict[str, dict[str, bool]]:
        return _request(self._executor, self._pool, "engine_kinds", all_ranks=False)

    def __getitem__(self, role: str) -> RemoteRoleEngines:
        parts = self._parts()
        if role not in parts:
            raise KeyError(f"pool {self._pool!r} hosts no role {role!r}; it hosts {', '.join(parts)}")
        return RemoteRoleEngines(self._executor, self._pool, role, parts[role])

    def __contains__(self, role: str) -> bool:
        return role in self._parts()

    def __iter__(self) -> Iterator[str]:
        return iter(self._parts())

    def __setitem__(self, role: str, engines) -> None:
        _request(self._executor, self._pool, "set_engines", role, engines, all_ranks=True)


class RemoteWorker:
    """``executor.workers[pool]``: the pool's engines and the device name its slots compute on."""

    def __init__(self, executor: "RayExecutor", pool: str):
        self.engines = RemoteEngines(executor, pool)
        first = executor.topology.pool_slots(pool)[0]
        self.device = executor.slot_info.get(first.name, {}).get("device", "cpu")
