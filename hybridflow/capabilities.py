"""What hybridflow's runtime does, stated once for the runtime that does it and the compiler that predicts it.

The compiler prices and checks plans for the runtime's engines; the runtime must then behave as priced. Each
figure or name both sides need is defined here, in a module that imports neither side, so neither has to import
the other to read it:

- the rollout engines the runtime can build (``runtime.engines.registry`` builds them, ``compiler.rollout_engines``
  prices them) and the train engines it runs (``compiler.machine.bind`` refuses a plan that needs another);
- the shared-prompt threshold of the train engine's forward (``runtime.engines.shared_prompt`` applies it, the
  cost model predicts with it);
- the bucket size of a weight sync (``runtime.weight_sync`` streams in buckets of it, the cost model prices a sync
  with it).
"""
from __future__ import annotations

__all__ = ["AGENT_DEFAULTS", "ROLLOUT_ENGINE_NAMES", "DEFAULT_ROLLOUT_ENGINE", "RUNTIME_TRAIN_ENGINES",
           "SHARED_PROMPT_REFERENCE_WIDTH", "SHARED_PROMPT_MIN_SAVED", "shared_prompt_threshold",
           "WEIGHT_SYNC_BUCKET_BYTES"]

ROLLOUT_ENGINE_NAMES: tuple[str, ...] = ("hf", "vllm")
"""Rollout engines by name: ``hf`` (transformers generation), ``vllm`` (the optional extra). The runtime's builders
and the cost model's factors are tables keyed by exactly these names."""

DEFAULT_ROLLOUT_ENGINE = "hf"
"""The rollout engine of a generating role when the config names none."""

RUNTIME_TRAIN_ENGINES: tuple[str, ...] = ("fsdp",)
"""Training engines hybridflow's runtime executes (the cost model knows more: ``compiler.engine.TRAIN_ENGINES``)."""

SHARED_PROMPT_REFERENCE_WIDTH = 256
"""The model width at which a shared-prompt threshold is stated (``CostOptions.shared_prompt_min_saved``)."""

SHARED_PROMPT_MIN_SAVED = 64
"""Prompt positions hybridflow's train engine requires the sharing to save (``(rows - distinct prompts) x P``)
before it uses it, at width :data:`SHARED_PROMPT_REFERENCE_WIDTH`: it costs a second backbone call. The engine
(``runtime.engines.shared_prompt.MIN_SAVED_POSITIONS``) applies it, the cost model predicts with it. Measured on
one CPU thread (GRPO update, 7.9M-parameter model, hidden 256, P = 5, 3 response positions): one group of 8 (35
saved) 232 ms shared vs 208 ms joined, two groups (70) 291 vs 297, four (140) 356 vs 477."""


def shared_prompt_threshold(min_saved: int, hidden: int | None) -> int:
    """Prompt positions the shared-prompt forward must save in a model of width ``hidden``: ``ceil(min_saved·256/hidden)``.

    ``min_saved`` holds at width 256; a saved position's work grows with the width while the second
    backbone call's cost is mostly fixed, so the break-even falls as the width grows. The train
    engine (runtime.engines.shared_prompt) and the cost model both apply this rule. None: ``min_saved``.
    """
    if not hidden:
        return min_saved
    return -(-min_saved * SHARED_PROMPT_REFERENCE_WIDTH // hidden)


WEIGHT_SYNC_BUCKET_BYTES = 256 * 2**20
"""Bytes per bucket of a weight sync: the runtime streams the weights in buckets of this size
(``runtime.weight_sync.DEFAULT_BUCKET_BYTES``) and the cost model predicts a sync with it."""


AGENT_DEFAULTS = {"max_turns": 4, "max_tokens_per_turn": 32, "max_total_tokens": 128}
"""The budgets of a multi-turn rollout whose generate node leaves them None: the agent loop
(``runtime.engines.agent_loop.AgentParams``) runs with them and the cost model prices with them."""
ENV_WORKER_THREADS = 32
"""Environment calls (reset, step) one worker of an environment pool runs at once: the Ray actor's
``max_concurrency`` (``runtime.ray.env_pool``), and what the cost model prices a pool's concurrency with."""
