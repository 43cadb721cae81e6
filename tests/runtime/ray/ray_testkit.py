"""Shared pieces of the Ray tests: tiny models and specs, prompts, and hand-built multi-device plans.

ExecutionPlan is plain data, so the tests build the placements they need by hand
(:func:`hand_plan`) rather than depending on the compiler's search. Everything here is
pickled by value into the Ray workers (see conftest), so reward functions defined here
run there.
"""
from __future__ import annotations

import torch

from hybridflow.compiler.local_plan import plan_local
from hybridflow.compiler.plan import ExecutionPlan, LayoutPlan, PoolPlan, RolePlacement, verify_plan
from hybridflow.data import make_prompt_batch, make_tiny_model, make_tiny_tokenizer
from hybridflow.data.tasks.arithmetic import make_arithmetic_rows
from hybridflow.runtime.engines import SamplingParams, TrainEngineConfig, ValueModel
from hybridflow.runtime.roles import RoleSpec
from hybridflow_ops.rewards.arithmetic import compute_score

TOKENIZER = make_tiny_tokenizer("arithmetic")
ROWS = make_arithmetic_rows()


def tiny_model(seed: int = 0, layers: int = 2):
    return make_tiny_model("qwen2", vocab_size=len(TOKENIZER), hidden=32, layers=layers, heads=2, kv_heads=1, seed=seed)


def tiny_critic(seed: int = 1) -> ValueModel:
    state = torch.get_rng_state()
    torch.manual_seed(seed)  # the value head is drawn from the global RNG: fix it so every process builds the same
    critic = ValueModel.from_causal_lm(tiny_model(seed))
    torch.set_rng_state(state)
    return critic


def role_specs(graph, *, reward=compute_score, lr: float = 1e-2, max_new_tokens: int = 3, **train) -> dict[str, RoleSpec]:
    """One spec per role of ``graph``: tiny qwen2 models, fp32, rule reward ``reward``."""
    sampling = SamplingParams(max_new_tokens=max_new_tokens, seed=0)
    config = TrainEngineConfig(lr=lr, precision="fp32", **train)
    specs = {}
    for role in graph.roles:
        if role.kind == "policy":
            specs[role.name] = RoleSpec(model=tiny_model(), tokenizer=TOKENIZER, sampling=sampling, train=config)
        elif role.kind == "critic":
            specs[role.name] = RoleSpec(model=tiny_critic(), train=config)
        elif role.kind == "reference":
            specs[role.name] = RoleSpec(model=tiny_model())
        else:
            specs[role.name] = RoleSpec(reward=reward, tokenizer=TOKENIZER)
    return specs


def prompts(step: int = 0, count: int = 3):
    """``count`` arithmetic prompts, different for every step."""
    return make_prompt_batch(ROWS[step * count:(step + 1) * count], TOKENIZER)


PLACEMENTS = {
    # every role on one pool of two devices: data parallel (FSDP2) everywhere, hybrid engine
    "colocate": lambda roles: {"pool0": (roles, 2)},
    # the policy side and the reward side on pools of their own
    "split": lambda roles: {"pool0": tuple(r for r in roles if r in ("actor", "ref")),
                            "pool1": tuple(r for r in roles if r not in ("actor", "ref"))},
    # one pool per role
    "standalone": lambda roles: {f"pool{i}": ((r,), 1) for i, r in enumerate(roles)},
}


def placement_plan(graph, name: str) -> ExecutionPlan:
    """The ``colocate`` / ``split`` / ``standalone`` plan of ``graph`` on virtual devices."""
    pools = PLACEMENTS[name](tuple(r.name for r in graph.roles))
    pools = {k: v if isinstance(v[-1], int) else (v, 1) for k, v in pools.items()}
    return hand_plan(graph, pools, strategy=name)


def hand_plan(graph, pools: dict[str, tuple[tuple[str, ...], int]], *, generation: tuple[str, str] | None = None,
              strategy: str = "manual") -> ExecutionPlan:
    """``pools``: name -> (roles, device count); ``generation``: (policy role, pool) for a separate rollout pool.

    The schedule is plan_local's (graph order, a weight sync before each generation), with every op moved to
    its role's pool; a policy's generate op runs on the generation pool, and its weight sync broadcasts there.
    """
    where = {role: name for name, (roles, _) in pools.items() for role in roles}
    missing = {r.name for r in graph.roles} - set(where) - ({generation[0]} if generation else set())
    assert not missing, f"roles {missing} have no pool"
    offset, pool_plans = 0, []
    for name, (_, count) in pools.items():
        pool_plans.append(PoolPlan(name=name, devices=tuple(f"n0.d{offset + i}" for i in range(count))))
        offset += count
    size = {name: count for name, (_, count) in pools.items()}
    placements = []
    for role in graph.roles:
        gen_pool = generation[1] if generation and generation[0] == role.name else None
        placements.append(RolePlacement(
            role=role.name, pool=where[role.name], layout=LayoutPlan(dp=size[where[role.name]]),
            generation_layout=LayoutPlan(dp=size[gen_pool or where[role.name]]) if role.kind == "policy" else None,
            generation_pool=gen_pool))
    gen_of = {p.role: p.generation_pool for p in placements if p.generation_pool}
    ops = []
    for op in plan_local(graph).ops:
        pool = None if op.pool is None else where[op.role]
        update = {"pool": pool}
        if op.kind == "weight_sync" and op.role in gen_of:
            update["target_pool"] = gen_of[op.role]
        if op.kind == "node" and graph.node(op.node).kind == "generate" and op.role in gen_of:
            update["pool"] = gen_of[op.role]
        ops.append(op.model_copy(update=update))
    plan = ExecutionPlan(graph=plan_local(graph).graph, cluster="virtual", strategy=strategy, pools=tuple(pool_plans),
                         placements=tuple(placements), ops=tuple(ops))
    verify_plan(plan, after="hand_plan")
    return plan


# -- a rendezvous of reward functions on different pools (proves they run at the same time) ----------

def rendezvous_actor(parties: int, timeout_s: float = 60.0):
    """A Ray actor whose ``arrive(name)`` returns once ``parties`` callers have arrived (or raises on timeout)."""
    import asyncio

    import ray

    @ray.remote(num_cpus=0)
    class Rendezvous:
        def __init__(self):
            self.arrived: list[str] = []
            self.event = asyncio.Event()

        async def arrive(self, name: str) -> list[str]:
            self.arrived.append(name)
            if len(self.arrived) >= parties:
                self.event.set()
            await asyncio.wait_for(self.event.wait(), timeout_s)
            return sorted(self.arrived)

    return Rendezvous.remote()


def meeting_score(rendezvous, name: str, score: float = 1.0):
    """A compute_score that, on its first call, waits at ``rendezvous`` for the other parties."""
    met = []

    def compute(data_source, solution_str, ground_truth, extra_info=None):
        import ray

        if not met:
            met.extend(ray.get(rendezvous.arrive.remote(name)))
        return score

    return compute


# -- faults ---------------------------------------------------------------------------------------------

KILL = "kill-this-worker"


def kill_on_marker(data_source, solution_str, ground_truth, extra_info=None):
    """The arithmetic reward, except that scoring a sample whose ground truth is :data:`KILL` SIGKILLs this process."""
    import os
    import signal

    if ground_truth == KILL:
        os.kill(os.getpid(), signal.SIGKILL)
    return compute_score(data_source, solution_str, ground_truth, extra_info)


def marked_prompts(count: int = 3):
    """``count`` prompts, the last one marked to kill the worker that scores it."""
    rows = [dict(r) for r in ROWS[:count]]
    rows[-1]["ground_truth"] = KILL
    return make_prompt_batch(rows, TOKENIZER)


# -- an algorithm with the off-policy correction, for overlapped (staleness 1) plans --------------------

from hybridflow.algorithms import grpo_is as grpo_tis  # noqa: E402  (GRPO with the truncated-IS loss)


def kill_when_marked(marker: str):
    """The arithmetic reward; a call that finds the file ``marker`` removes it and SIGKILLs this process (once)."""
    def compute(data_source, solution_str, ground_truth, extra_info=None):
        import os
        import signal

        if os.path.exists(marker):
            os.remove(marker)
            os.kill(os.getpid(), signal.SIGKILL)
        return compute_score(data_source, solution_str, ground_truth, extra_info)

    return compute
