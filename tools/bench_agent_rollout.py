"""Rollout throughput of the agent loop against single-turn generation at equal model tokens.

Single-turn: ``T = turns x tokens_per_turn`` tokens per response in one decode (KV cache through).
Agent loop: ``turns`` turns of ``tokens_per_turn`` tokens against an environment that answers each
turn with a fixed 4-token observation (no tool work), so both produce the same number of model
tokens per sample (EOS does not stop either: ``stop_at_eos=False``). The agent loop pays a prefill
of the whole context per turn (prompt + trajectory so far) and the environment round trip.

Run: python tools/bench_agent_rollout.py [--size tiny|10m] [--prompts 64] [--turns 4] [--tokens-per-turn 16] [--repeats 3]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from hybridflow.agents import register_env
from hybridflow.data import make_prompt_batch, make_tiny_model
from hybridflow.data.tasks.agent_calc import ALPHABET, make_sum3_rows
from hybridflow.data.tiny import bench_model_shape, make_tiny_tokenizer
from hybridflow.runtime.engines.agent_loop import AgentParams
from hybridflow.runtime.engines.rollout_hf import HFRolloutEngine
from hybridflow.runtime.engines.sampling import SamplingParams


@register_env("bench_fixed_turns")
class FixedTurns:
    """Answers every turn with ``{ok}``; never ends an episode (the loop's max_turns does)."""

    def reset(self, prompt):
        return ""

    def step(self, action):
        return "{ok}", 0.0, False, {}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="tiny")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--tokens-per-turn", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    tokenizer = make_tiny_tokenizer(alphabet=ALPHABET)
    model = make_tiny_model(vocab_size=len(tokenizer), seed=0, **bench_model_shape(args.size)).eval()
    engine = HFRolloutEngine(model, tokenizer=tokenizer)
    prompts = make_prompt_batch(make_sum3_rows(args.prompts, seed=0), tokenizer)
    total = args.turns * args.tokens_per_turn
    obs = len(tokenizer("{ok}", add_special_tokens=False)["input_ids"])
    agent = AgentParams(env="bench_fixed_turns", max_turns=args.turns, max_tokens_per_turn=args.tokens_per_turn,
                        max_total_tokens=args.turns * (args.tokens_per_turn + obs))
    runs = {"single-turn": lambda: engine.generate(prompts, SamplingParams(max_new_tokens=total, stop_at_eos=False, seed=0)),
            "agent loop": lambda: engine.generate_agentic(prompts, SamplingParams(stop_at_eos=False, seed=0), agent)}
    print(f"model {args.size} ({sum(p.numel() for p in model.parameters()) / 1e6:.2f} M params), {args.prompts} samples, "
          f"{args.turns} turns x {args.tokens_per_turn} tokens = {total} model tokens each, {args.threads} thread(s)")
    rates = {}
    for name, run in runs.items():
        run()  # warm
        seconds, tokens = [], 0
        for _ in range(args.repeats):
            start = time.perf_counter()
            out = run()
            seconds.append(time.perf_counter() - start)
            tokens = int(out["response_mask"].sum())
        rates[name] = tokens / statistics.median(seconds)
        print(f"{name:12s} {tokens} model tokens  median {statistics.median(seconds):.3f} s  "
              f"{rates[name]:.0f} tokens/s  (runs: {', '.join(f'{s:.3f}' for s in seconds)})")
    print(f"agent loop / single-turn throughput: {rates['agent loop'] / rates['single-turn']:.2f}")


if __name__ == "__main__":
    main()
