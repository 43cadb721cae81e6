"""Benchmark: a lower bound on a GRPO step of tools/bench_vs_trl.py's speed mode, its matrix products alone.

    PYTHONPATH=. python tools/bench_roofline.py --size 10m --new-tokens 64 --prompts 8 --group 8
    PYTHONPATH=. python tools/bench_roofline.py --size 10m --new-tokens 64 --prompts 8 --group 8 --trl-step 4.355

Whatever else an implementation does, a step of fp32 GRPO on this CPU computes these matrix products:

- decoding: at each step ``t`` after the prefill, the rows still going (``r_t``, no more) through every
  layer's projections and MLP and the ``lm_head``, one token each; each layer's own weights (so what does
  not stay in the caches is read again, as in a real decode);
- the update: the forward's products over each distinct prompt once and every response token, and the
  backward's two per weight (the input's gradient and the weight's), as one product each over all tokens.

q/k/v and gate/up run as one product each (the fastest form measured here). Each product is first timed alone
in every form torch's two fp32 product libraries offer (MKL; oneDNN, on a reordered weight in the decode; a
weight's gradient also as the transpose of ``x^T g``), the fastest form is kept, and then the step's products
run one after another, as a step runs them (a weight the caches did not keep is read again). Response lengths
are drawn as the speed mode's ``spread`` model samples them (``tools/bench_trl/common.py``: geometric, mean
half of ``--new-tokens``, or ``--mean-len``) for ``--batches`` batches; each distinct row count's products are
timed once (process CPU time, ``--threads`` threads, the best of ``--repeats``) and summed over the steps.
Attention, norms, the rotary embedding, sampling, the loss, the optimizer and the framework are left out: the
sum is a bound no implementation doing the same arithmetic in fp32 with these libraries goes below on this
CPU. ``--trl-step S`` also prints what a step ``S / 2`` seconds long (2x TRL's ``S``) leaves for all of that.
It also prints the step's products when the update's forward takes the decode's outputs instead of computing
them (hybridflow's ``keep_products``, ``hybridflow/runtime/engines/decode_tape.py``): the decode's and the
backward's alone, a bound for an implementation that reuses them (one update per decode, weights unchanged).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "bench_trl"))
from common import spread_stop_probability  # noqa: E402
from flops import matmul_peak  # noqa: E402

from hybridflow.data.tiny import BENCH_MODELS, make_tiny_model  # noqa: E402


def layer_weights(model: torch.nn.Module) -> list[list[torch.Tensor]]:
    """Each layer's weights as the fastest form multiplies them: ``[q|k|v, o, gate|up, down]``; then ``[lm_head]``."""
    layers = []
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        layers.append([torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).detach(),
                       attn.o_proj.weight.detach(), torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).detach(),
                       mlp.down_proj.weight.detach()])
    return layers + [[model.lm_head.weight.detach()]]


def cpu_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best


def _onednn() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def _dnn(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T`` by oneDNN (``weight``: a plain or reordered ``(out, in)`` weight, or a transposed view)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], "")


def fastest(repeats: int, *forms):
    """The fastest of ``forms`` (callables computing the same product), timed one by one."""
    return min(forms, key=lambda form: cpu_seconds(form, repeats))


def whole_pass(products: list, repeats: int) -> float:
    """CPU s of ``products`` run one after another, as a step runs them: a weight the caches did not keep since
    its last product is read again (timing each product in a loop of its own would keep it in the caches)."""

    def run():
        for product in products:
            product()
    return cpu_seconds(run, repeats)


def forward_products(weights: list[list[torch.Tensor]], rows: int, repeats: int) -> float:
    """CPU s of ``rows`` tokens through every weight once (each weight its own input of its width), each
    product in the faster form of MKL and oneDNN on a reordered weight (what a decode can keep for all its steps)."""
    products = []
    for w in (w for layer in weights for w in layer):
        x, out = torch.randn(rows, w.shape[1]), torch.empty(rows, w.shape[0])
        forms = [lambda x=x, w=w, out=out: torch.mm(x, w.t(), out=out)]
        if _onednn():
            packed = torch.ops.mkldnn._reorder_linear_weight(w, rows)
            forms.append(lambda x=x, packed=packed: _dnn(x, packed))
        products.append(fastest(repeats, *forms))
    return whole_pass(products, repeats)


def update_products(weights: list[list[torch.Tensor]], tokens: int, repeats: int) -> tuple[float, float]:
    """CPU s of the forward's and the backward's products over ``tokens`` tokens, each in the fastest form: MKL
    or oneDNN, a weight's gradient also as the transpose of ``x^T g``; and of the backward's alone (an update
    whose forward takes the decode's products, hybridflow/runtime/engines/decode_tape.py)."""
    products, backward = [], []
    for w in (w for layer in weights for w in layer):
        x, g = torch.randn(tokens, w.shape[1]), torch.randn(tokens, w.shape[0])
        forward = [lambda x=x, w=w: x @ w.t()]
        input_grad = [lambda g=g, w=w: g @ w]
        weight_grad = [lambda g=g, x=x: g.t() @ x, lambda g=g, x=x: (x.t() @ g).t()]
        if _onednn():
            forward.append(lambda x=x, w=w: _dnn(x, w))
            input_grad.append(lambda g=g, w=w: _dnn(g, w.t()))
            weight_grad += [lambda g=g, x=x: _dnn(g.t(), x.t()), lambda g=g, x=x: _dnn(x.t(), g.t()).t()]
        timed = [fastest(repeats, *forms) for forms in (forward, input_grad, weight_grad)]
        products += timed
        backward += timed[1:]
    return whole_pass(products, repeats), whole_pass(backward, repeats)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(BENCH_MODELS), default="10m")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=5, help="tokens of a prompt (5: '3+4=' with the bench "
                        "tokenizer, as tools/bench_vs_trl.py counts it)")
    parser.add_argument("--vocab", type=int, default=25, help="vocabulary size (25: the bench tokenizer's)")
    parser.add_argument("--mean-len", type=float, help="the mean response length to draw (default: half of "
                        "--new-tokens, the spread model's target; give the speed run's 'resp len' to match it)")
    parser.add_argument("--batches", type=int, default=50, help="sampled batches of response lengths")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--trl-step", type=float, help="TRL's CPU s per step from a speed run: prints the budget 2x leaves")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = make_tiny_model("qwen2", vocab_size=args.vocab, seed=args.seed, **BENCH_MODELS[args.size])
    weights = layer_weights(model)
    rows = args.prompts * args.group
    p = spread_stop_probability(args.new_tokens, (args.mean_len or args.new_tokens / 2) / args.new_tokens)
    lengths = (torch.distributions.Geometric(torch.tensor(p)).sample((args.batches, rows)).long() + 1).clamp(
        max=args.new_tokens)
    # row l is fed l - 1 tokens after the prefill (its last token is sampled, not fed)
    counts = [[int((batch > t).sum()) for t in range(1, args.new_tokens)] for batch in lengths]
    timed = {r: forward_products(weights, r, args.repeats) for r in sorted({r for c in counts for r in c if r})}
    prefill = forward_products(weights, args.prompts * args.prompt_len, args.repeats)
    decode = prefill + statistics.mean(sum(timed[r] for r in c if r) for c in counts)
    mean_len = float(lengths.float().mean())
    tokens = round(args.prompts * args.prompt_len + rows * mean_len)
    update, backward = update_products(weights, tokens, args.repeats)
    peak = matmul_peak(args.threads)
    flop = 2 * sum(w.numel() for layer in weights for w in layer)  # one token through every product
    decode_flop = flop * (args.prompts * args.prompt_len + rows * (mean_len - 1))
    result = {"size": args.size, "rows": rows, "mean_response_len": mean_len, "row_steps": statistics.mean(map(sum, counts)),
              "decode_s": decode, "update_s": update, "update_backward_s": backward, "update_tokens": tokens,
              "peak_gflops": peak,
              "decode_gflops": decode_flop / decode / 1e9, "update_gflops": 3 * flop * tokens / update / 1e9}
    print(f"{args.size} model, {args.prompts} x {args.group} rows, {args.new_tokens} new tokens: mean response "
          f"{mean_len:.2f} tokens, {result['row_steps']:.0f} row-steps fed after the prefill ({args.batches} batches)")
    print(f"  this CPU's fp32 matmul peak: {peak:.1f} GFLOP/s ({args.threads} thread(s))")
    print(f"  decode products:  {decode:.3f} CPU s  ({result['decode_gflops']:.1f} GFLOP/s, "
          f"{result['decode_gflops'] / peak:.0%} of peak)")
    print(f"  update products:  {update:.3f} CPU s  ({result['update_gflops']:.1f} GFLOP/s, "
          f"{result['update_gflops'] / peak:.0%} of peak; {tokens} tokens)")
    print(f"  step, products alone: {decode + update:.3f} CPU s")
    print(f"  the update's backward products alone: {backward:.3f} CPU s; the step's products with the update's "
          f"forward taking the decode's (decode_tape): {decode + backward:.3f} CPU s")
    if args.trl_step:
        budget = args.trl_step / 2
        print(f"  2x TRL's {args.trl_step:.3f} s is {budget:.3f} s a step: {budget - decode - update:.3f} s left for "
              f"attention, norms, rotary, sampling, loss, optimizer and framework ({budget - decode - backward:.3f} s "
              "with the decode's products taken)")
    return result


if __name__ == "__main__":
    main()
