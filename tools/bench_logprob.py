"""Benchmark: chunked fused log-probs against ``log_softmax(lm_head(h)).gather(...)`` on CPU.

    .venv/bin/python tools/bench_logprob.py            # V = 32,000, hidden 1,024, B*T = 8,192 (~2 min, ~3.5 GB)
    .venv/bin/python tools/bench_logprob.py --small    # ~10 s, for a smoke run

What is compared (float32, torch's default thread count):

* naive:   ``torch.log_softmax(h @ W.T, -1).gather(-1, ids)``, autograd as usual;
* chunked: :func:`hybridflow_ops.token_logprobs_from_hidden` with ``--chunk-size`` rows per chunk.

Both get the same upstream gradient (a fixed random ``(b*t,)`` vector) in backward.

How peak memory is measured. Each (variant, repeat) runs in a fresh Python
subprocess, so nothing one variant allocated or cached can hide in the other's
figures. On CPU torch allocates straight from glibc, and every buffer that
matters here (>= 32 MB) is its own ``mmap``, which goes back to the kernel on
free, so the process's resident set follows live tensor memory. The worker
allocates the inputs (h, W, ids, upstream gradient), runs a tiny warm-up, then
reads its resident set size ``base`` from ``/proc/self/status`` (VmRSS). Before
each phase it resets the kernel's peak-RSS counter by writing ``5`` to
``/proc/self/clear_refs`` (Linux >= 4.0), and after the phase it reads the peak
``VmHWM``. The figure printed is ``VmHWM - base``: the most memory the process
held beyond its inputs at any moment of the phase, counted by the kernel (no
sampling, nothing missed). For backward this includes what forward saved for it
(the naive path's ``(b*t, v)`` log-softmax) and the gradients themselves
(``grad_h``, ``grad_W``, the same for both). Pages are counted only once written,
and every buffer in both variants is written, so untouched allocations cannot
flatter either side.

Timing: wall-clock (and process CPU time, which a busy shared machine disturbs
less) of forward and of backward in the same worker; the script
alternates naive and chunked workers ``--repeats`` times (default 3) in one run
and prints the medians, the ratios chunked/naive, and whether the targets
(memory <= 1/4 of naive, time <= 1.3x naive, each phase) are met. The machine is
shared, so timings carry noise; ratios within one run are the figure to read.

What to expect. Memory: forward holds one ``(chunk, v)`` float32 buffer
(128 MB at chunk 1024, V 32k) against the naive path's logits + log-softmax
(2 GB); backward adds ``grad_W``/``grad_h`` (~160 MB, both paths) against the
naive path's saved log-softmax + two ``(b*t, v)`` gradients (3 GB): ratios
~0.07 and ~0.10. Time: forward does the same one GEMM as the naive path (ratio
~1.0 in CPU time); backward recomputes the logits, so it does three
``(b*t) x h x v`` GEMMs where the naive path does two, and its CPU-time ratio
sits near 1.4 (the naive path's passes over 1 GB tensors win some of it back,
more so when other processes share the memory bus). That third GEMM is the
price of not storing the logits.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

MB = 1024 * 1024
MEMORY_TARGET, TIME_TARGET = 0.25, 1.3


def _status_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {key}; this benchmark needs Linux")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _phase(fn, base_kb: int):
    """Run ``fn``; return (its result, wall seconds, process CPU seconds, peak resident bytes beyond ``base_kb``)."""
    _reset_peak()
    start, cpu_start = time.perf_counter(), time.process_time()
    result = fn()
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    return result, seconds, cpu_seconds, (_status_kb("VmHWM") - base_kb) * 1024


def worker(variant: str, n: int, vocab: int, hidden_size: int, chunk_size: int) -> dict:
    """One measurement in this (fresh) process: forward then backward of ``variant``."""
    import torch
    from hybridflow_ops import token_logprobs_from_hidden

    def run(h, w, ids):
        if variant == "naive":
            return torch.log_softmax(h @ w.T, dim=-1).gather(-1, ids[:, None]).squeeze(-1)
        return token_logprobs_from_hidden(h[None], w, ids[None], chunk_size=chunk_size).log_probs[0]

    gen = torch.Generator().manual_seed(0)
    h = torch.randn(n, hidden_size, generator=gen).requires_grad_()
    w = (torch.randn(vocab, hidden_size, generator=gen) / hidden_size ** 0.5).requires_grad_()
    ids = torch.randint(0, vocab, (n,), generator=gen)
    upstream = torch.randn(n, generator=gen)
    small = run(h[:64].detach().requires_grad_(), w.detach().requires_grad_(), ids[:64])
    small.backward(upstream[:64])  # warm-up: thread pool, kernels, autograd engine
    del small
    base_kb = _status_kb("VmRSS")
    out, fwd_s, fwd_cpu, fwd_peak = _phase(lambda: run(h, w, ids), base_kb)
    _, bwd_s, bwd_cpu, bwd_peak = _phase(lambda: out.backward(upstream), base_kb)
    return {"fwd_s": fwd_s, "bwd_s": bwd_s, "fwd_cpu": fwd_cpu, "bwd_cpu": bwd_cpu,
            "fwd_peak": fwd_peak, "bwd_peak": bwd_peak,
            "inputs_mb": (h.numel() + w.numel()) * 4 / MB, "threads": torch.get_num_threads()}


def _measure(variant: str, args) -> dict:
    cmd = [sys.executable, __file__, "--worker", variant, "--n", str(args.n), "--vocab", str(args.vocab),
           "--hidden", str(args.hidden), "--chunk-size", str(args.chunk_size)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"worker {variant} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _report(runs: dict[str, list[dict]], args) -> None:
    first = runs["naive"][0]
    print(f"B*T={args.n} V={args.vocab} hidden={args.hidden} chunk_size={args.chunk_size} float32 "
          f"threads={first['threads']} repeats={args.repeats} inputs={first['inputs_mb']:.0f} MB")
    print(f"{'phase':<9}{'naive':>22}{'chunked':>22}{'ratio':>9}  target")
    for phase in ("fwd", "bwd"):
        med = {v: statistics.median(r[f"{phase}_s"] for r in runs[v]) for v in runs}
        peak = {v: max(r[f"{phase}_peak"] for r in runs[v]) for v in runs}
        # a phase whose buffers all fit memory the process already held raises no peak (tiny --n / --vocab)
        t_ratio, m_ratio = med["chunked"] / med["naive"], peak["chunked"] / peak["naive"] if peak["naive"] else float("nan")
        print(f"{phase + ' time':<9}{med['naive']:>20.3f} s{med['chunked']:>20.3f} s{t_ratio:>9.3f}  "
              f"<= {TIME_TARGET} {'ok' if t_ratio <= TIME_TARGET else 'MISSED'}")
        cpu = {v: statistics.median(r[f"{phase}_cpu"] for r in runs[v]) for v in runs}
        print(f"{phase + ' cpu':<9}{cpu['naive']:>20.3f} s{cpu['chunked']:>20.3f} s"
              f"{cpu['chunked'] / cpu['naive']:>9.3f}  (CPU seconds of the process; less sensitive to a busy machine)")
        print(f"{phase + ' mem':<9}{peak['naive'] / MB:>19.1f} MB{peak['chunked'] / MB:>19.1f} MB{m_ratio:>9.3f}  "
              f"<= {MEMORY_TARGET} {'ok' if m_ratio <= MEMORY_TARGET else 'MISSED'}")
    for v in runs:
        print(f"  {v} times (fwd, bwd) per repeat: "
              + ", ".join(f"({r['fwd_s']:.2f}, {r['bwd_s']:.2f})" for r in runs[v]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--small", action="store_true", help="quick run: B*T=2,048, V=8,000, hidden 256, chunk 256")
    p.add_argument("--n", type=int, default=8192, help="rows, B*T")
    p.add_argument("--vocab", type=int, default=32000, help="vocabulary size V")
    p.add_argument("--hidden", type=int, default=1024, help="hidden size")
    p.add_argument("--chunk-size", type=int, default=1024, help="rows per chunk of the chunked op")
    p.add_argument("--repeats", type=int, default=3, help="alternating naive/chunked measurements; medians printed")
    p.add_argument("--worker", choices=("naive", "chunked"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.small:
        args.n, args.vocab, args.hidden, args.chunk_size = 2048, 8000, 256, 256
    if args.worker:
        print(json.dumps(worker(args.worker, args.n, args.vocab, args.hidden, args.chunk_size)))
        return 0
    runs: dict[str, list[dict]] = {"naive": [], "chunked": []}
    for _ in range(args.repeats):
        for variant in runs:
            runs[variant].append(_measure(variant, args))
    _report(runs, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
