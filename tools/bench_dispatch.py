"""Benchmark: the round trip of one op through the RayExecutor against the LocalExecutor.

    .venv/bin/python tools/bench_dispatch.py              # no-op, 1 MB and 64 MB batches, 20 rounds each (~1 min)
    .venv/bin/python tools/bench_dispatch.py --rounds 5   # quicker

The plan has one node: a ``score`` op of a reward role whose source does nothing
(it returns zeros), reading its four sequence fields straight from the graph
input, so an iteration is exactly one dispatch: the controller gathers the
node's input batch, hands it to the worker, and reads back the (tiny) scores.
The batch's payload is its two int64 ``(B, P)`` tensors (ids and mask, read
twice each by the node: as prompt and as response fields):

* no-op: ``B = P = 1``;
* 1 MB:  ``P = 1024``, ``B = 64``;
* 64 MB: ``P = 1024``, ``B = 4096``.

The LocalExecutor calls the worker in-process (no copy); the RayExecutor sends
the batch to a Ray actor (one slot of a one-device pool, on this machine)
through the object store and collects the result with ``ray.wait``. The
figure is the median wall time of ``run_iteration`` over ``--rounds`` rounds
after one warm-up, per payload and executor, and the ratio Ray / local.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

PAYLOADS = {"no-op": (1, 1), "1 MB": (64, 1024), "64 MB": (4096, 1024)}


class ZeroReward:
    """A reward source that does nothing: a zero score per sample."""

    def score(self, batch):
        from hybridflow.runtime.engines import RewardOutput

        return RewardOutput(torch.zeros(len(batch)), {})


def one_op_graph():
    """A graph with one score node that reads its sequence fields from the graph input ``prompts``."""
    from hybridflow.graph.serialize import graph_from_json

    inputs = [{"name": name, "source": "prompts", "field": field} for name, field in
              (("prompt_ids", "prompt_ids"), ("prompt_mask", "prompt_mask"),
               ("response_ids", "prompt_ids"), ("response_mask", "prompt_mask"))]
    graph = {"format": "hybridflow.graph", "version": 1, "name": "one_op", "attrs": {},
             "roles": [{"name": "reward", "kind": "reward", "trainable": False}],
             "inputs": [{"name": "prompts", "fields": ["prompt_ids: int64[B, P]", "prompt_mask: int64[B, P]"]}],
             "nodes": [{"name": "reward.score", "kind": "score", "role": "reward", "op": "score", "inputs": inputs,
                        "outputs": ["scores: float32[B]"], "attrs": {"field": "scores"}}]}
    return graph_from_json(json.dumps(graph))


def one_op_plan():
    """The one-op graph compiled for this machine, the reward on the CPU.

    The compiler prices a graph's first role as a model (the one the other roles default to), and the
    reward here computes nothing: a stand-in of a few hundred parameters says so (a 0.5B preset at the
    default batch shape would need more memory than a small machine has, for a plan that runs no model).
    """
    from hybridflow.compiler import ModelSpec, compile_for

    nothing = ModelSpec(name="zero-reward", layers=1, hidden=8, heads=1, kv_heads=1, intermediate=8, vocab=32)
    return compile_for(one_op_graph(), nothing, placement={"reward": "cpu"})


def batch(rows: int, length: int):
    from hybridflow.batch import Batch

    ids = torch.randint(3, 20, (rows, length))
    return Batch({"prompt_ids": ids, "prompt_mask": torch.ones_like(ids)})


def timed(executor, inputs, rounds: int) -> float:
    executor.run_iteration(inputs)  # warm-up
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        executor.run_iteration(inputs)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    import ray

    from hybridflow.runtime.local import LocalExecutor
    from hybridflow.runtime.ray import RayExecutor
    from hybridflow.runtime.roles import RoleSpec

    plan = one_op_plan()
    specs = {"reward": RoleSpec(reward=ZeroReward())}
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    local = LocalExecutor(plan, specs)
    with RayExecutor(plan, specs) as remote:
        print(f"{'payload':>8} {'bytes':>12} {'local ms':>10} {'ray ms':>10} {'ray/local':>10}")
        for name, (rows, length) in PAYLOADS.items():
            inputs = {"prompts": batch(rows, length)}
            nbytes = sum(t.numel() * t.element_size() for t in inputs["prompts"].tensors.values())
            t_local, t_ray = timed(local, inputs, args.rounds), timed(remote, inputs, args.rounds)
            print(f"{name:>8} {nbytes:>12,} {t_local * 1e3:>10.3f} {t_ray * 1e3:>10.2f} {t_ray / t_local:>10.1f}")
    ray.shutdown()


if __name__ == "__main__":
    main()
