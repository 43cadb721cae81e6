"""Warm workers: a process's Ray slots kept, with their placement groups, after an executor ends, for the next one.

Most of a slot's start is its process importing torch, transformers and hybridflow: on this project's 2-core
test machine an actor that only imports them took 4.1 s from creation to its first answer, against 0.3 s for an
empty actor (measured by hand; ``tools/bench_warm_workers.py`` times whole runs with and without keeping). A
process that starts several executors one after another (a test module, a notebook trying settings, a sweep of
short runs) pays that for every slot of every executor. With :func:`keep_workers` on, :meth:`RayExecutor.shutdown`
of an executor whose workers are healthy *parks* each pool instead of killing it: its placement group stays
reserved and each actor drops its engines and its ``torch.distributed`` groups (``_RayWorker.release`` in
:mod:`.executor`). The next executor in this process that needs a group of the same shape (the same bundles,
label selectors and strategy: :func:`pool_key`) takes the parked group and its actors, and each actor starts over
as a new slot (``_RayWorker.recycle``: the state a fresh worker has, then the usual probe, rendezvous and set-up).
On a one-node cluster each slot has a group of its own (:func:`.cluster.reserve_pools`), so a slot parked by a
pool of one can serve a rank of a pool of two. Every other parked group is stopped before the executor reserves
what it still needs, so parked groups never keep a reservation from fitting.

Off by default. Not kept: pools of an executor that met a failure, or restarts after one (their processes may be
the broken ones); environment pools (their workers stop; the slots they served are kept); parked pools whose Ray
session ended (``ray.shutdown``).
"""
from __future__ import annotations

import gc
import logging
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, remove_placement_group

__all__ = ["keep_workers", "keeping_workers", "Parked", "pool_key", "park", "take", "stop_parked", "parked_count"]

log = logging.getLogger("hybridflow.ray")

_KEEP = False
_PARKED: list["Parked"] = []


@dataclass
class Parked:
    """One pool's placement group and its actors (by bundle index), parked in Ray session ``session``."""

    key: tuple
    group: PlacementGroup
    actors: list[Any]
    session: tuple


def keep_workers(on: bool = True) -> None:
    """Keep the slots of executors that end healthy, for the next executor of this process (module docstring);
    ``False`` stops every parked pool and keeps none from then on."""
    global _KEEP
    _KEEP = on
    if not on:
        stop_parked()


def keeping_workers() -> bool:
    return _KEEP


def pool_key(bundle: dict, selectors: tuple, strategy: str, count: int) -> tuple:
    """What a parked pool must match to be taken: its bundles' resources, label selectors, strategy and size."""
    return (tuple(sorted(bundle.items())), tuple(tuple(sorted(s.items())) for s in selectors), strategy, count)


def _session() -> tuple:
    context = ray.get_runtime_context()
    return (context.gcs_address, context.get_job_id())


def park(pools: list[tuple[tuple, PlacementGroup, list[Any]]], *, timeout_s: float = 10.0) -> bool:
    """Release every actor of ``pools`` (key, group, actors by bundle index) and park them; False (nothing parked,
    the caller stops them) when one did not release within ``timeout_s``."""
    actors = [a for _, _, pool_actors in pools for a in pool_actors]
    refs = [a.release.remote() for a in actors]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    if len(ready) < len(refs):
        return False
    try:
        ray.get(refs)
    except Exception as err:  # a slot that cannot start over is not kept
        log.info("warm workers: not kept (%s: %s)", type(err).__name__, err)
        return False
    session = _session()
    _PARKED.extend(Parked(key, group, list(pool_actors), session) for key, group, pool_actors in pools)
    return True


def take(keys: dict[Any, tuple]) -> dict[Any, Parked]:
    """Name -> a parked group of its key, for as many of ``keys`` (a group's name -> :func:`pool_key`) as match,
    each parked group taken once; every parked group not taken is stopped (so the rest can be reserved), and so is
    every one of an ended Ray session. Taken groups answered a ping: their actors are alive."""
    if not _PARKED:
        return {}
    session = _session()
    live = [p for p in _PARKED if p.session == session]  # an ended session's handles: nothing left to stop
    _PARKED.clear()
    found: dict[Any, Parked] = {}
    for name, key in keys.items():
        match = next((p for p in live if p.key == key), None)
        if match is not None:
            live.remove(match)
            found[name] = match
    _stop(live)
    alive = [a for p in found.values() for a in p.actors]
    try:
        ray.get([a.ping.remote() for a in alive], timeout=30.0)
    except Exception as err:  # one died while parked: start fresh ones
        log.info("warm workers: a parked slot is gone (%s); starting new ones", type(err).__name__)
        _stop(list(found.values()))
        return {}
    return found


def stop_parked() -> None:
    """Kill every parked actor of this Ray session and remove its placement group."""
    session = _session() if ray.is_initialized() else None
    mine = [p for p in _PARKED if p.session == session]
    _PARKED.clear()
    _stop(mine)


def parked_count() -> int:
    """How many slots are parked (each pool's slots, or the environment's: none)."""
    return sum(len(p.actors) for p in _PARKED)


def _stop(pools: list[Parked]) -> None:
    actors = [a for p in pools for a in p.actors]
    for actor in actors:
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # already gone
            pass
    if actors:  # wait until Ray reports them gone before the groups go (see RayExecutor._stop_workers)
        ray.wait([a.ping.remote() for a in actors], num_returns=len(actors), timeout=30.0)
    for pool in pools:
        try:
            remove_placement_group(pool.group)
        except Exception:
            pass
    if pools:
        gc.collect()
