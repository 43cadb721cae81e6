"""Shared pieces of the Ray tests: tiny models and specs, prompts, and compiled multi-device plans.

Every plan here comes from the compiler (:func:`compiled_plan`: ``compile`` for a
machine of virtual GPUs, then ``bind``), as in a training run. Everything here is
pickled by value into the Ray workers (see conftest), so reward functions defined here
run there.
"""
from __future__ import annotations

import torch

from hybridflow.compiler import Machine, compile_for
from hybridflow.compiler.models import ModelSpec
from hybridflow.compiler.passes import BatchShape
from hybridflow.compiler.plan import ExecutionPlan
from hybridflow.data import make_prompt_batch, make_tiny_model, make_tiny_tokenizer
from hybridflow.data.tasks.arithmetic import make_arithmetic_rows
from hybridflow.runtime.engines import SamplingParams, TrainEngineConfig, ValueModel
from hybridflow.runtime.roles import RoleSpec
from hybridflow_ops.rewards.arithmetic import compute_score

TOKENIZER = make_tiny_tokenizer("arithmetic")
ROWS = make_arithmetic_rows()


def tiny_model(seed: int = 0, layers: int = 2):
    return make_tiny_model("qwen2", vocab_size=len(TOKENIZER), hidden=32, layers=layers, heads=2, kv_heads=1, seed=seed)


def log_probs_under(state: dict, batch) -> torch.Tensor:
    """The log-probs of ``batch``'s responses under the tiny model with weights ``state`` (fp32, this process)."""
    from hybridflow.runtime.engines import TrainEngine

    engine = TrainEngine(tiny_model(), TrainEngineConfig(precision="fp32"))
    engine.module.load_state_dict(state)
    return engine.compute_log_probs(batch)


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


TINY = ModelSpec.from_config(tiny_model().config.to_dict(), name="tiny-qwen2")
BATCH = BatchShape(prompts=3, prompt_len=8, response_len=3, mini_batches=1)


def compiled_plan(graph, placement, slots: int, *, staleness: int = 0) -> ExecutionPlan:
    """``graph`` compiled for ``slots`` (virtual) GPUs of the test's Ray cluster and bound to them.

    The test cluster's GPUs are Ray resources only: slots reserve them and compute on CPU.
    """
    machine = Machine("cuda", slots, where="ray")
    return compile_for(graph, TINY, machine=machine, placement=placement, staleness=staleness, batch=BATCH)


def placement_plan(graph, name: str) -> ExecutionPlan:
    """The ``colocate`` (every model role on one pool of 2 devices), ``split`` (the policy side and the rest on a
    device each; for a graph without a critic, actor and ref apart), ``standalone`` (a device per model role),
    ``auto`` (the search's, on 2 devices) or ``device_map`` (actor on cuda:0, the other models on cuda:1) plan."""
    model_roles = [r.name for r in graph.roles if r.kind not in ("reward", "cost")]
    if name == "colocate":
        return compiled_plan(graph, "colocate", 2)
    if name == "split":
        critic = any(r.kind == "critic" for r in graph.roles)
        return compiled_plan(graph, "split" if critic else "actor@1;ref@1", 2)
    if name == "auto":  # the search's choice on two devices
        return compiled_plan(graph, "auto", 2)
    if name == "device_map":  # the seed article's form: the policy on one GPU, the other models on another
        return compiled_plan(graph, {r: "cuda:0" if r == "actor" else "cuda:1" for r in model_roles}, 2)
    return compiled_plan(graph, "standalone", len(model_roles))


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


# -- what the workers hold, through plans and the transport --------------------------------------------

def train_state(executor, role: str) -> dict:
    """``role``'s whole train state (model, optimizer, schedule; full tensors, gathered on a sharded pool): an
    ``export`` plan with the optimizer."""
    from hybridflow.compiler.control import control_plan

    plan = control_plan(executor.plan, "export", [role], items=("optimizer",))
    return executor.run_plan(plan).results[f"{role}.export"][0]["train_state"]


def run_ahead(executor, batches: list, k: int, role: str = "actor", after_step=None) -> tuple[list, list]:
    """Run ``batches`` as steps with generation up to ``k`` steps ahead (each step gets the next ``k`` batches as
    ``next_inputs``), checking the buffer's bound after every step. ``after_step(i)``, if given, runs after step ``i``
    (before its weights are read). Returns ``(weights, results)``: ``weights[v]`` is ``role``'s model at version
    ``v`` (before step ``v``'s update), ``results[i]`` step ``i``'s result."""
    weights, results = [train_state(executor, role)["model"]], []
    for i in range(len(batches)):
        following = batches[i + 1:min(i + 1 + k, len(batches))]
        results.append(executor.run_iteration(batches[i], next_inputs=following))
        assert len(executor.ahead) == len(following) <= k  # the bounded buffer
        if after_step is not None:
            after_step(i)
        weights.append(train_state(executor, role)["model"])
    return weights, results


def on_pool(executor, pool: str, kind: str, role: str, batch, *args):
    """The node method ``kind`` of ``role`` on every slot of ``pool``, through the executor's transport, the batch
    split over the pool's data-parallel ranks and the results merged (as the interpreter sends a node op)."""
    from hybridflow.runtime.dispatch import balances_tokens, merge_results, split_for_ranks

    slots = executor.topology.pool_slots(pool)
    split = split_for_ranks(kind, batch, len(slots), balance_tokens=balances_tokens(executor.specs.get(role)))
    refs = [executor.send(slot, kind, role, part, *args) for slot, part in zip(slots, split.parts)]
    while not all(executor.ready(refs)):
        executor.wait(refs, 1.0)
    results = [executor.fetch(ref, slot, f"{kind} of {role!r}")[0] for ref, slot in zip(refs, slots)]
    return merge_results(kind, split, results)


def hang_when_marked(marker: str):
    """The arithmetic reward; once the file ``marker`` exists, a call blocks for ever (a planted hang: only the
    executor's shutdown, which kills the worker, ends it)."""
    def planted_hang(data_source, solution_str, ground_truth, extra_info=None):
        import os
        import threading

        if os.path.exists(marker):
            threading.Event().wait()
        return compute_score(data_source, solution_str, ground_truth, extra_info)

    return planted_hang
