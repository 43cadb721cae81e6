"""Rollout throughput of the hf and vllm engines on the same models, and the cost of one weight update into vLLM.

Run in vLLM's environment (``make vllm-env``):

    OMP_NUM_THREADS=1 .venv-vllm/bin/python tools/bench_rollout.py [--threads 1] [--samples 64] [--tokens 64]

For each model made in code — ``tiny`` (the built-in task's size: hidden 64, 2 layers, but 2 heads
of 64/2 = 32 dims, the smallest head size vLLM's CPU attention supports, where the built-in model
has 4 of 16) and the standard bench models ``10m`` and ``100m`` (``hybridflow.data.tiny.BENCH_MODELS``) — both engines generate ``samples``
responses (8 prompts x samples/8) of exactly ``tokens`` tokens (EOS ignored, so both decode the
same number of tokens), after one untimed warm-up call each; then ``--rounds`` rounds (default 3),
each timing one hf run and one vllm run back to back, printed as the median tokens/s of each and
the median of the per-round ratios vllm / hf (a 2-core machine shared with other work swings a
single run by 1.5x; alternating keeps both sides of a ratio under the same load). Then the seconds of one full weight update into vLLM
(``update_weights`` of every tensor: its ``reload_weights``) against a raw ``copy_`` of the same
state dict into a second torch module. Seconds on a shared machine are noisy; the ratios are the
figures to compare, and both sides of each ratio are measured in the same run.
"""
from __future__ import annotations

import argparse
import copy
import importlib.util
import statistics
import time

import torch

from hybridflow.data.tiny import BENCH_MODELS  # noqa: E402  (torch is imported above)

MODELS = {
    "tiny": dict(hidden=64, layers=2, heads=2, kv_heads=1),  # vLLM's CPU attention needs heads of >= 32 dims
    "10m": BENCH_MODELS["10m"],
    "100m": BENCH_MODELS["100m"],
}


def _prompts(tokenizer, count: int):
    from hybridflow.data import make_prompt_batch
    from hybridflow.data.tasks.arithmetic import make_arithmetic_rows

    return make_prompt_batch(make_arithmetic_rows()[:count], tokenizer)


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_model(name: str, samples: int, tokens: int, rounds: int = 3, vllm_options: dict | None = None) -> dict[str, float]:
    from hybridflow.data import make_tiny_model, make_tiny_tokenizer
    from hybridflow.runtime.engines import HFRolloutEngine, SamplingParams
    from hybridflow.runtime.engines.registry import VLLMOptions
    from hybridflow.runtime.engines.rollout_vllm import VLLMRolloutEngine

    tokenizer = make_tiny_tokenizer("arithmetic")
    model = make_tiny_model("llama", vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                            max_positions=256, **MODELS[name])
    params = sum(p.numel() for p in model.parameters())
    prompts = _prompts(tokenizer, 8)
    sampling = SamplingParams(n=samples // 8, max_new_tokens=tokens, stop_at_eos=False, seed=0)
    hf = HFRolloutEngine(copy.deepcopy(model), tokenizer=tokenizer)
    started = time.perf_counter()
    vllm = VLLMRolloutEngine.from_module(copy.deepcopy(model), tokenizer=tokenizer,
                                         options=VLLMOptions(**{"max_model_len": 256, "max_num_seqs": samples,
                                                                 **(vllm_options or {})}))
    start_s = time.perf_counter() - started
    for engine in (hf, vllm):
        engine.generate(prompts, sampling)  # warm-up (vLLM's first call compiles kernels)
    rates: dict[str, list[float]] = {"hf": [], "vllm": []}
    for _ in range(rounds):
        for label, engine in (("hf", hf), ("vllm", vllm)):
            rates[label].append(samples * tokens / _timed(lambda: engine.generate(prompts, sampling)))
    out = {f"{label}_tokens_per_s": statistics.median(r) for label, r in rates.items()}
    out["ratio"] = statistics.median(v / h for h, v in zip(rates["hf"], rates["vllm"]))
    state = model.state_dict()
    target = copy.deepcopy(model).state_dict()
    out["update_vllm_s"] = _timed(lambda: vllm.update_weights(state.items()))
    out["copy_state_dict_s"] = _timed(lambda: [target[n].copy_(t) for n, t in state.items()])
    out.update(params=float(params), vllm_start_s=start_s)
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (both engines)")
    parser.add_argument("--samples", type=int, default=64, help="responses per run (a multiple of 8)")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per response")
    parser.add_argument("--rounds", type=int, default=3, help="alternating timed rounds per model (medians)")
    parser.add_argument("--models", nargs="+", default=["tiny", "10m"], choices=list(MODELS))
    parser.add_argument("--vllm-option", action="append", default=[], metavar="KEY=VALUE",
                        help="an option of the vllm engine (rollout_engine_options), e.g. dtype=bfloat16, "
                             "max_num_seqs=16, enforce_eager=false; repeatable")
    args = parser.parse_args(argv)
    if importlib.util.find_spec("vllm") is None:
        raise SystemExit("bench_rollout compares the hf engine with vLLM, which this Python cannot import: make vLLM's "
                         "environment with `make vllm-env` and run .venv-vllm/bin/python tools/bench_rollout.py "
                         "(docs/rollout_engines.md)")
    vllm_options = {}
    for item in args.vllm_option:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--vllm-option {item!r}: expected KEY=VALUE")
        vllm_options[key] = {"true": True, "false": False}.get(value.lower(), int(value) if value.isdigit() else value)
    torch.set_num_threads(args.threads)
    print(f"{args.samples} samples x {args.tokens} tokens, {args.threads} thread(s), vllm options {vllm_options or 'default'}")
    for name in args.models:
        r = bench_model(name, args.samples, args.tokens, args.rounds, vllm_options)
        print(f"{name:>5} ({r['params'] / 1e6:.2f}M params): hf {r['hf_tokens_per_s']:8.0f} tok/s  "
              f"vllm {r['vllm_tokens_per_s']:8.0f} tok/s  ratio vllm/hf {r['ratio']:.2f}x  "
              f"| weight update into vllm {r['update_vllm_s'] * 1e3:.1f} ms vs state-dict copy "
              f"{r['copy_state_dict_s'] * 1e3:.2f} ms ({r['update_vllm_s'] / r['copy_state_dict_s']:.1f}x)  "
              f"| vllm start {r['vllm_start_s']:.1f} s")


if __name__ == "__main__":
    main()
