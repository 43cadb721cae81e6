"""Peak memory of an update's backward with its gradients added into the flat buffers or summed by autograd.

The shared-prompt forward (``hybridflow/runtime/engines/shared_prompt.py``) uses every weight twice, the
embedding included. With autograd summing the two uses, the responses' gradient of each weight is held until
the prompts' backward has run; for the embedding that is a dense ``(vocab, hidden)`` tensor, made by each use's
backward. Inside ``grad_slots.gradients_into`` (the train engine's CPU updates) the lean backward adds each
projection's gradient, and the embedding's looked-up rows, into the weight's buffer as it computes them.

Each side runs in a process of its own (one torch thread): a model with random weights made in code, the
gradient buffers allocated and zeroed, then one forward of ``shared_response_hidden`` and its backward. Printed
per side: RSS before the step, the peak over the step (``VmHWM`` reset through ``/proc/self/clear_refs``, so
Linux only) and its rise, the step's CPU seconds; then the rise's ratio.

    python tools/bench_grad_memory.py                              # vocab 151,936, hidden 896, 2 layers
    python tools/bench_grad_memory.py --vocab 32000 --hidden 512 --json out.json
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIDES = ("autograd", "buffers")


def _status(field: str) -> int:
    """A ``/proc/self/status`` memory field, in MiB."""
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith(field + ":"))
    return int(line.split()[1]) // 1024


def measure(side: str, vocab: int, hidden: int, layers: int, heads: int, kv_heads: int, prompts: int, group: int,
            prompt_len: int, response_len: int) -> dict:
    """One side, in this process: RSS before the step, its peak over the step and the step's CPU seconds."""
    import torch

    from hybridflow.data import make_tiny_model
    from hybridflow.runtime.engines.grad_slots import gradients_into
    from hybridflow.runtime.engines.shared_prompt import shared_response_hidden

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = make_tiny_model("qwen2", vocab_size=vocab, hidden=hidden, layers=layers, heads=heads,
                            kv_heads=kv_heads).train()
    prompt_ids = torch.randint(4, vocab, (prompts, prompt_len)).repeat_interleave(group, 0)
    response_ids = torch.randint(4, vocab, (prompts * group, response_len))
    buffers = {id(p): torch.zeros_like(p) for p in model.parameters()}
    for param in model.parameters():
        param.grad = buffers[id(param)]
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM from here
    before, start = _status("VmRSS"), time.process_time()
    hidden_states = shared_response_hidden(model.base_model, prompt_ids, torch.ones_like(prompt_ids), response_ids,
                                           torch.ones_like(response_ids))
    if hidden_states is None:
        raise SystemExit("bench_grad_memory: the shared-prompt forward does not apply at these sizes (it needs "
                         "(prompts x group - prompts) x prompt-len >= ceil(16384 / hidden) prompt positions saved): "
                         "raise --group, --prompt-len or --hidden")
    with gradients_into(buffers if side == "buffers" else {}):
        (hidden_states * torch.linspace(-1, 1, hidden)).sum().backward()
    cpu = time.process_time() - start
    peak = _status("VmHWM")
    return {"side": side, "rss_before_mb": before, "peak_mb": peak, "rise_mb": peak - before, "cpu_s": round(cpu, 3)}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, default=151936, help="vocabulary size (Qwen2's by default)")
    parser.add_argument("--hidden", type=int, default=896)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=14)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=4, help="distinct prompts")
    parser.add_argument("--group", type=int, default=4, help="responses per prompt")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--response-len", type=int, default=64)
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)  # one side, in this process
    parser.add_argument("--json", default=None, help="write the results to this file")
    args = parser.parse_args(argv)
    shape = dict(vocab=args.vocab, hidden=args.hidden, layers=args.layers, heads=args.heads, kv_heads=args.kv_heads,
                 prompts=args.prompts, group=args.group, prompt_len=args.prompt_len, response_len=args.response_len)
    if args.side:
        print(json.dumps(measure(args.side, **shape)))
        return {}
    results = {}
    for side in SIDES:
        command = [sys.executable, __file__, "--side", side] + [
            part for key, value in shape.items() for part in (f"--{key.replace('_', '-')}", str(value))]
        proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"bench_grad_memory: the {side} side failed:\n{proc.stderr[-3000:]}")
        results[side] = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"vocab {args.vocab}, hidden {args.hidden}, {args.layers} layers; {args.prompts} prompts x {args.group} "
          f"responses, {args.prompt_len} + {args.response_len} tokens; one thread")
    print(f"{'side':9} {'RSS before MB':>13} {'peak MB':>8} {'rise MB':>8} {'CPU s':>6}")
    for r in results.values():
        print(f"{r['side']:9} {r['rss_before_mb']:>13} {r['peak_mb']:>8} {r['rise_mb']:>8} {r['cpu_s']:>6.2f}")
    ratio = results["buffers"]["rise_mb"] / max(results["autograd"]["rise_mb"], 1)
    print(f"rise over the step, buffers / autograd: {ratio:.2f}")
    results["rise_ratio"] = round(ratio, 3)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
