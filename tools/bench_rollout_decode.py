"""Benchmark: the rollout decode loop's lean path against the transformers path, interleaved in one run.

    python tools/bench_rollout_decode.py                           # the tiny model, 8 prompts x 8, 8 new tokens
    python tools/bench_rollout_decode.py --size 10m --new-tokens 64
    python tools/bench_rollout_decode.py --json
    git show main:hybridflow/runtime/engines/lean_decode.py > /tmp/lean_before.py
    python tools/bench_rollout_decode.py --against /tmp/lean_before.py   # a change to the lean path, before/after
    python tools/bench_rollout_decode.py --size 10m --new-tokens 64 --spread --against /tmp/lean_before.py

One model (hybridflow.data.tiny, random weights, ``--arch``), one batch of left-padded
prompts of mixed lengths, ``n`` samples each, no stop at EOS (every row decodes all
``--new-tokens``, so both paths do the same work). Each round calls
:func:`hybridflow.runtime.engines.decode.decode` with ``path="hf"`` and ``path="lean"``
(order alternating) from generators seeded alike, checks that both gave the same tokens,
and times each on the wall clock and in process CPU time (the figure to read on a
busy machine, see tools/bench_overhead.py). Printed: median ms per call of each path, the median per-round ratio
``hf / lean`` and per-token figures.

``--spread``: responses of realistic, spread lengths instead: the model's EOS logit is set as
tools/bench_vs_trl.py's ``--model spread`` sets it (tools/bench_trl/common.py, ``set_stop_logits``:
sampled responses average half of ``--new-tokens``, geometrically spread) and decoding stops at EOS.
Each path then decodes until its last row ends; printed too: the mean response length and the
row-steps each path fed through the model after the prefill (``Decoded.row_steps``) against
``rows x steps`` (every row fed until the last one ends).

``--against FILE`` times another version of ``hybridflow/runtime/engines/lean_decode.py`` (a copy
of the file, e.g. from ``git show``) as the ``hf`` side instead, both through ``path="lean"``, and
checks that tokens *and* log-probs are equal to the bit: before/after figures of a lean-path change
(``--against`` with ``--close``: log-probs within 1e-5 instead, for a change that reorders float sums).

Also printed: each path's achieved GFLOP/s in CPU time (FLOPs counted as in tools/bench_trl/flops.py)
as a fraction of this CPU's fp32 matmul peak, measured in the same process and thread count.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from hybridflow.data.tiny import BENCH_MODELS as SIZES  # noqa: E402  (the standard bench models: tiny, 10m, 100m)


def setup(args):
    from hybridflow.data.tiny import make_tiny_model

    torch.manual_seed(args.seed)
    model = make_tiny_model(args.arch, vocab_size=args.vocab, seed=args.seed, **SIZES[args.size]).eval()
    lengths = torch.randint(3, args.prompt_len + 1, (args.prompts,))
    ids = torch.randint(4, args.vocab, (args.prompts, args.prompt_len))
    mask = (torch.arange(args.prompt_len)[None] >= args.prompt_len - lengths[:, None]).long()
    return model, ids * mask, mask


def load_lean_version(path: str):
    """``lean_stepper`` of a copy of lean_decode.py at ``path`` (imported as a sibling module, for its relative imports)."""
    import importlib.util
    import inspect

    spec = importlib.util.spec_from_file_location("hybridflow.runtime.engines._lean_against", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    factory = module.lean_stepper
    accepted = len(inspect.signature(factory).parameters)  # an older version may take fewer arguments

    def make(*args):  # a version older than LeanStepper.row_steps: count the rows fed here
        stepper = factory(*args[:accepted])
        if stepper is not None and not hasattr(stepper, "row_steps"):
            stepper.row_steps, step = 0, stepper.step

            def counted(t, token, alive):
                stepper.row_steps += token.shape[0]
                return step(t, token, alive)

            stepper.step = counted
        return stepper

    return make


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--arch", choices=("qwen2", "llama"), default="qwen2")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--against", metavar="FILE", help="a lean_decode.py version timed in place of the hf path")
    parser.add_argument("--close", action="store_true", help="with --against: log-probs within 1e-5, not bitwise")
    parser.add_argument("--spread", action="store_true",
                        help="stop at EOS, with the EOS logit set so that responses average half of --new-tokens")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from hybridflow.runtime.engines import decode as decode_module
    from hybridflow.runtime.engines.decode import decode
    from hybridflow.runtime.engines.sampling import SamplingParams

    steppers = {"lean": decode_module.lean_stepper}
    if args.against:
        steppers["hf"] = load_lean_version(args.against)

    model, ids, mask = setup(args)
    sys.path.insert(0, str(Path(__file__).resolve().parent / "bench_trl"))
    from flops import ModelShape, matmul_peak

    if args.spread:
        from common import set_stop_logits

        with torch.no_grad():
            set_stop_logits(model, eos_id=2, pad_id=0, budget=args.new_tokens)
    params = SamplingParams(n=args.group, max_new_tokens=args.new_tokens, stop_at_eos=args.spread)
    times: dict[str, list[float]] = {"hf": [], "lean": []}
    cpu: dict[str, list[float]] = {"hf": [], "lean": []}
    row_steps: dict[str, list[int]] = {"hf": [], "lean": []}
    lengths, full_steps, work = [], [], []
    shape, prompt_len = ModelShape.of(model), round(float(mask.sum(1).float().mean()))
    same = True
    for r in range(args.rounds + 2):
        outs = {}
        for path in (("hf", "lean") if r % 2 == 0 else ("lean", "hf")):
            gen = torch.Generator().manual_seed(r)
            if args.against:
                decode_module.lean_stepper = steppers[path]
            start, start_cpu = time.perf_counter(), time.process_time()
            outs[path] = decode(model, ids, mask, params, eos_token_ids=[2], pad_token_id=0, generator=gen,
                                path="lean" if args.against else path)
            if r >= 2:  # two warm-up rounds
                times[path].append(time.perf_counter() - start)
                cpu[path].append(time.process_time() - start_cpu)
                row_steps[path].append(outs[path].row_steps)
        if r >= 2:
            length = float(outs["lean"].response_mask.sum(1).mean())
            lengths.append(length)
            full_steps.append(outs["lean"].response_ids.shape[0] * (outs["lean"].steps - 1))
            work.append(shape.generation(args.prompts, args.group, prompt_len, length))
        same &= torch.equal(outs["hf"].response_ids, outs["lean"].response_ids)
        if args.against and args.close:
            same &= torch.allclose(outs["hf"].log_probs, outs["lean"].log_probs, rtol=1e-5, atol=1e-5)
        elif args.against:
            same &= torch.equal(outs["hf"].log_probs, outs["lean"].log_probs)
    params_count = sum(p.numel() for p in model.parameters())
    peak = matmul_peak(args.threads)
    result = {"size": args.size, "arch": args.arch, "parameters": params_count, "rows": args.prompts * args.group,
              "new_tokens": args.new_tokens, "threads": args.threads, "rounds": args.rounds, "same_tokens": bool(same),
              "against": args.against, "spread": args.spread, "gflop": round(statistics.mean(work) / 1e9, 3),
              "matmul_peak_gflops": round(peak, 1), "response_len": round(statistics.mean(lengths), 2),
              "row_steps_all_rows": round(statistics.mean(full_steps), 1)}
    for clock, t in (("wall", times), ("cpu", cpu)):
        result[clock] = {"hf_ms": round(1e3 * statistics.median(t["hf"]), 2),
                         "lean_ms": round(1e3 * statistics.median(t["lean"]), 2),
                         "speedup": round(statistics.median(h / l for h, l in zip(t["hf"], t["lean"])), 2)}
    for path in ("hf", "lean"):  # achieved arithmetic in CPU time, as the peak is measured (per round: its lengths)
        result["cpu"][f"{path}_gflops"] = round(statistics.median(w / c for w, c in zip(work, cpu[path])) / 1e9, 2)
        result[f"{path}_row_steps"] = round(statistics.mean(row_steps[path]), 1)
    if args.json:
        print(json.dumps(result))
        return result
    print(f"decode, {args.arch} {args.size} ({params_count / 1e6:.2f}M parameters), {args.prompts} prompts x {args.group}, "
          f"{args.new_tokens} new tokens, {args.threads} thread(s), {args.rounds} interleaved rounds")
    before = f"lean path of {args.against}" if args.against else "transformers path"
    if args.spread:
        print(f"  spread lengths (stop at EOS): mean response {result['response_len']:.2f} tokens; row-steps fed after "
              f"the prefill, mean a call: {before} {result['hf_row_steps']:.0f}, lean path {result['lean_row_steps']:.0f} "
              f"(every row until the last ends: {result['row_steps_all_rows']:.0f})")
    for clock in ("cpu", "wall"):
        c = result[clock]
        print(f"  {clock:4} {before} {c['hf_ms']:.2f} ms, lean path {c['lean_ms']:.2f} ms per call "
              f"-> {c['speedup']:.2f}x (median of per-round ratios)")
    c = result["cpu"]
    print(f"  achieved (CPU time, {result['gflop']:.2f} GFLOP a call, tools/bench_trl/flops.py): {before} "
          f"{c['hf_gflops']:.1f} GFLOP/s = {c['hf_gflops'] / peak:.1%}, lean path {c['lean_gflops']:.1f} GFLOP/s = "
          f"{c['lean_gflops'] / peak:.1%} of this CPU's fp32 matmul peak {peak:.1f} GFLOP/s")
    agree = " and log-probs (within 1e-5)" if args.close else " and log-probs (bitwise)" if args.against else ""
    print(f"  same tokens{agree} on every round: {same}")
    return result


if __name__ == "__main__":
    main()
