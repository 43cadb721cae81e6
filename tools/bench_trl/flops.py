"""Arithmetic of the speed benchmarks: this CPU's measured matmul peak and the FLOPs a step's work needs.

Used by tools/bench_vs_trl.py speed and tools/bench_rollout_decode.py to say how close generation and
the update come to what the CPU can compute: achieved FLOP/s = the work's FLOPs / its time, as a
fraction of :func:`matmul_peak` measured in the same process with the same thread count.

FLOPs counted (the work an ideal implementation cannot avoid, the same count for every side):

- a token through the model: ``2 x P`` (a multiply and an add per weight of every matmul, ``P`` = the
  parameters without the embedding table, whose lookup is no arithmetic; ``lm_head`` included),
  plus attention: ``4 x layers x heads x head_dim x context`` (``q k^T`` and ``softmax(.) v``);
- generation: each distinct prompt once (its keys and values are shared by its group), then one token
  per response token (EOS included); rows that finished and are still fed padding count nothing;
- the update: forward and backward, ``3 x`` the forward's FLOPs over each prompt once and every response
  token (the old log-probs come from the rollout, as on both sides of the benchmark).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch


def matmul_peak(threads: int, n: int = 1024, repeats: int = 12) -> float:
    """GFLOP/s of the fastest of ``repeats`` fp32 ``(n, n) @ (n, n)`` matmuls on ``threads`` threads, in process
    CPU time (as the benchmarks' generation and update figures: on a busy machine the wall clock measures the
    share of the core the scheduler gave, not the arithmetic), the faster of the two product libraries torch
    ships: MKL (``torch.mm``) and, where the build has it, oneDNN (measured here: ~103 and ~110 GFLOP/s on one
    thread; hybridflow's decode and update run their large products on oneDNN, lean_decode.product and dense)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(n, n), torch.randn(n, n)
        out = torch.empty(n, n)
        products = [lambda: torch.mm(a, b, out=out)]
        if torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise"):
            weight = b.t().contiguous()  # a Linear's (out, in) weight: a @ b
            products.append(lambda: torch.ops.mkldnn._linear_pointwise(a, weight, None, "none", [], ""))
        best = float("inf")
        for product in products:
            product()  # warm-up
            for _ in range(repeats):
                start = time.process_time()
                product()
                best = min(best, time.process_time() - start)
    finally:
        torch.set_num_threads(before)
    return 2 * n ** 3 / best / 1e9


@dataclass(frozen=True)
class ModelShape:
    """What the FLOP counts need of a decoder: dense parameters, layers, query heads x head dim."""

    dense_params: int
    layers: int
    attention_width: int  # heads x head_dim

    @classmethod
    def of(cls, model: torch.nn.Module) -> "ModelShape":
        config = model.config
        embed = model.get_input_embeddings().weight.numel()
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(sum(p.numel() for p in model.parameters()) - embed, config.num_hidden_layers,
                   config.num_attention_heads * head_dim)

    def token(self, context: float) -> float:
        """FLOPs of one token's forward attending to ``context`` positions."""
        return 2 * self.dense_params + 4 * self.layers * self.attention_width * context

    def generation(self, prompts: int, group: int, prompt_len: int, response_len: float) -> float:
        """FLOPs of sampling ``group`` responses of mean length ``response_len`` after each of ``prompts`` prompts."""
        prefill = prompts * prompt_len * self.token(prompt_len / 2)
        return prefill + prompts * group * response_len * self.token(prompt_len + response_len / 2)

    def update(self, prompts: int, group: int, prompt_len: int, response_len: float) -> float:
        """FLOPs of the forward and backward over the step's tokens (each prompt once)."""
        return 3 * self.generation(prompts, group, prompt_len, response_len)
