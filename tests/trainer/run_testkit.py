"""Helpers of the trainer tests that stop and resume runs."""
from __future__ import annotations


class StopAt:
    """A tracker that interrupts the run when asked to log ``step`` (as a kill during that step would)."""

    def __init__(self, step: int):
        self.step = step

    def log(self, metrics, step):
        if step == self.step:
            raise KeyboardInterrupt

    def close(self):
        pass


def learned(metrics: dict) -> dict:
    """A step's metrics without its timings: what a resumed run must reproduce."""
    return {k: v for k, v in metrics.items() if not k.startswith(("timing_s/", "perf/"))}


def sampled_log_prob_gap(trainer, rows, **generate) -> float:
    """Sample ``rows`` with the trainer's policy where it generates (``generate``: the node's settings, e.g. n, seed)
    and score the samples with its train engine, in one plan on the training plan's pools (after its weight
    sync, like validation): the largest gap between the rollout's log-probs and the train engine's. ~0 when the
    rollout engine samples with the trained weights."""
    import warnings

    import hybridflow as hf
    from hybridflow.compiler.control import graph_plan
    from hybridflow.data import make_prompt_batch
    from hybridflow.graph.errors import UnusedValueWarning

    policy = next(r.name for r in trainer.graph.roles if r.kind == "policy")

    def probe(prompts, actor):
        actor.logprob(actor.generate(prompts, **generate))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedValueWarning)
        graph = hf.algorithm(probe, name="probe", roles={"actor": "policy"}).build()
    if policy != "actor":
        raise ValueError(f"the probe graph names its policy 'actor'; this trainer's is {policy!r}")
    prompts = make_prompt_batch(rows, trainer.tokenizer)
    env = trainer.executor.run_plan(graph_plan(trainer.plan, graph), {"prompts": prompts}).env
    sampled, scored = env["actor.generate"], env["actor.logprob"]["old_log_probs"]
    return float(((sampled["rollout_log_probs"] - scored) * sampled["response_mask"]).abs().max())
