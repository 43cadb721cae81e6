"""The plan's environment pools on Ray: environment workers as actors, and the rollout slots' handle on them.

A plan gives each role whose generate nodes have an environment an environment pool (``env``, a
:class:`~hybridflow.compiler.plan.PoolPlan` with ``workers``). The RayExecutor reserves it like a host
pool (one fractional-CPU bundle per worker, :func:`.cluster.pool_groups`) and here

* :func:`start_env_workers` starts one :class:`EnvWorker` actor per bundle; each holds the environments
  of the samples given to it, by key, and runs their ``reset``/``step`` on up to
  :data:`ENV_WORKER_THREADS` threads at once (a slow tool call holds back only its own sample);
* :func:`attach_env_pools` gives every slot hosting the role's rollout engine a :class:`RemoteEnvs`
  (an :class:`~hybridflow.runtime.engines.agent_loop.EnvHost`): the agent loop opens its samples'
  environments through it, round-robin over the workers, and gets :class:`RemoteEnv` proxies whose
  ``reset``/``step`` run in the environment's worker (a sample stays on one worker: environments are
  stateful). An environment that raises raises the same exception in the loop as an in-process one,
  so the loop's messages are the same; tool errors are observations the environment makes, wherever it
  runs.
"""
from __future__ import annotations

import os
import uuid
from collections import defaultdict
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import ray

from ...agents.env import resolve_env
from ...capabilities import ENV_WORKER_THREADS

if TYPE_CHECKING:  # an environment worker's process imports this module: it needs neither, nor the torch they import
    from ...compiler.plan import ExecutionPlan
    from ..topology import Topology

__all__ = ["ENV_WORKER_THREADS", "EnvWorker", "RemoteEnv", "RemoteEnvs", "start_env_workers", "attach_env_pools",
           "env_worker_handles"]


class EnvWorker:
    """One environment worker: the environments of the samples given to it, by key (see the module docstring)."""

    def __init__(self) -> None:
        self.envs: dict[str, Any] = {}

    def ping(self) -> int:
        """This worker's process id (and a cheap call that fails once the process is gone)."""
        return os.getpid()

    def open(self, env: str, keys: Sequence[str]) -> tuple[str, tuple[str, ...]]:
        """An environment of ``env`` for each key; the environment's class name and stop strings."""
        factory = resolve_env(env)
        made = [factory() for _ in keys]
        self.envs.update(zip(keys, made))
        first = made[0] if made else None
        return type(first).__name__, tuple(getattr(first, "stop_strings", ()))

    def reset(self, key: str, prompt: Mapping[str, Any]) -> Any:
        return self.envs[key].reset(prompt)

    def step(self, key: str, action: str) -> Any:
        return self.envs[key].step(action)

    def close(self, keys: Sequence[str]) -> None:
        for key in keys:
            self.envs.pop(key, None)


_RemoteEnvWorker = ray.remote(EnvWorker)


def _call(ref) -> Any:
    """A remote environment call's value; the environment's own exception if it raised (as an in-process one would)."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as err:
        cause = getattr(err, "cause", None)
        if isinstance(cause, BaseException):
            raise cause from None
        raise


class RemoteEnv:
    """One sample's environment in an environment worker: ``reset``/``step`` run there."""

    def __init__(self, worker, key: str, env_name: str, stop_strings: tuple[str, ...]):
        self.worker, self.key, self.env_name, self.stop_strings = worker, key, env_name, stop_strings

    def reset(self, prompt: Mapping[str, Any]) -> Any:
        return _call(self.worker.reset.remote(self.key, dict(prompt)))

    def step(self, action: str) -> Any:
        return _call(self.worker.step.remote(self.key, action))


class RemoteEnvs:
    """An :class:`~hybridflow.runtime.engines.agent_loop.EnvHost` over an environment pool's workers."""

    def __init__(self, workers: Sequence[Any]):
        self.workers = tuple(workers)
        self.concurrency = len(self.workers) * ENV_WORKER_THREADS
        """Environment calls the pool runs at once: the agent loop keeps that many steps in flight."""

    def open(self, env: str, count: int) -> list[RemoteEnv]:
        prefix = uuid.uuid4().hex
        owner = [k % len(self.workers) for k in range(count)]  # round-robin: sample k on worker k mod W
        keys = [f"{prefix}/{k}" for k in range(count)]
        mine = defaultdict(list)
        for key, w in zip(keys, owner):
            mine[w].append(key)
        opened = {w: self.workers[w].open.remote(env, ks) for w, ks in mine.items()}
        found = {w: _call(ref) for w, ref in opened.items()}
        return [RemoteEnv(self.workers[w], key, *found[w]) for key, w in zip(keys, owner)]

    def close(self, envs: Sequence[RemoteEnv]) -> None:
        keys = defaultdict(list)
        for env in envs:
            keys[env.worker].append(env.key)
        ray.get([worker.close.remote(ks) for worker, ks in keys.items()])


def start_env_workers(plan: ExecutionPlan, placement, bundles: Mapping[str, Mapping[str, float]]
                      ) -> dict[str, list[Any]]:
    """Environment pool name -> its workers, one actor per bundle of the pool's placement group (``placement(pool,
    k)``: the group and bundle index of worker ``k``, :meth:`.cluster.PoolReservation.placement`)."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    found = {}
    for pool in (p for p in plan.pools if p.workers):
        found[pool.name] = [
            _RemoteEnvWorker.options(num_cpus=bundles[pool.name]["CPU"], max_concurrency=ENV_WORKER_THREADS,
                                     max_restarts=0, max_task_retries=0, scheduling_strategy=PlacementGroupSchedulingStrategy(
                                         *placement(pool.name, k))).remote()
            for k in range(pool.workers)]
    return found


def attach_env_pools(plan: ExecutionPlan, topology: Topology, workers: Mapping[str, list[Any]], actor) -> list:
    """Give each slot hosting a role's rollout engine a :class:`RemoteEnvs` over the role's environment pool;
    the calls' refs (``actor(slot)``: the slot's Worker actor)."""
    refs = []
    for placement in (p for p in plan.placements if p.env_pool):
        host = RemoteEnvs(workers[placement.env_pool])
        slots = (s for s in topology.slots if any(r.role == placement.role and r.rollout for r in s.roles))
        refs += [actor(slot).attach_envs.remote(placement.role, host) for slot in slots]
    return refs


def env_worker_handles(workers: Mapping[str, list[Any]]) -> dict[str, Any]:
    """The workers by a name for the executor's table of actors: ``<pool>/env<k>``."""
    return {f"{pool}/env{k}": handle for pool, handles in workers.items() for k, handle in enumerate(handles)}

