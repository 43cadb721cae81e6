"""The sandbox fault table: each hostile program, the limit that stopped it, and the time to the error observation.

Each case runs through the ``calc_python`` environment's step (so what is timed is what a rollout
waits for: the call parsed, the sandbox started, the program stopped, the observation made), one at a
time, then all together on the environment's thread pool as one rollout's tool calls would run,
to show that the batch takes as long as its slowest limit and not the sum.

Run: python tools/sandbox_faults.py [--cpu 2 --wall 5 --memory 256] [--cases 'fork bomb' ...]
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import time

from hybridflow.agents.calc_env import CalcPythonEnv
from hybridflow.agents.sandbox import SandboxLimits, run_python
from hybridflow.agents.tools import ToolResult, register_tool

CASES = {
    "infinite loop": "while True:\n    pass",
    "sleeps forever": "import time\ntime.sleep(3600)",
    "fork bomb": "import os\nwhile True:\n    os.fork()",
    "huge output": "while True:\n    print('x' * 10000)",
    "huge allocation": "blob = bytearray(8 << 30)",
    "read /etc/hostname": "print(open('/etc/hostname').read())",
    "read ../../etc": "print(open('../../etc/hostname').read())",
    "list /": "import os\nprint(os.listdir('/'))",
    "open a socket": "import socket\nsocket.create_connection(('127.0.0.1', 22))",
    "well-behaved": "print(sum(range(10)))",
}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", type=int, default=2)
    parser.add_argument("--wall", type=float, default=5.0)
    parser.add_argument("--memory", type=int, default=256)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES), metavar="CASE",
                        help=f"the cases to run (default: all): {', '.join(CASES)}")
    args = parser.parse_args(argv)
    cases = {name: CASES[name] for name in args.cases}
    limits = SandboxLimits(cpu_s=args.cpu, wall_s=args.wall, memory_mb=args.memory)
    register_tool("python")(lambda code: run_python(code, limits))  # the env's python tool, with these limits
    print(f"limits: cpu {limits.cpu_s} s, wall {limits.wall_s:g} s, memory {limits.memory_mb} MiB, "
          f"processes {limits.max_processes}, output {limits.max_output_bytes} bytes written / "
          f"{limits.max_output_chars} chars shown")
    print(f"\n{'case':22s} {'limit':11s} {'to observation':>15s}  observation")

    def one(code: str) -> tuple[str, ToolResult | None, float]:
        env = CalcPythonEnv()
        env.reset({"prompt": "", "ground_truth": "0"})
        start = time.perf_counter()
        observation, _, _, info = env.step(f"<tool>python: {code}</tool>")
        return observation, info.get("tool_limit"), time.perf_counter() - start

    for name, code in cases.items():
        observation, limit, seconds = one(code)
        shown = observation.replace("\n", " ")
        print(f"{name:22s} {str(limit):11s} {seconds:13.2f} s  {shown[:60]}{'...' if len(shown) > 60 else ''}")
    start = time.perf_counter()
    with cf.ThreadPoolExecutor(len(cases)) as pool:
        results = list(pool.map(one, cases.values()))
    total = time.perf_counter() - start
    print(f"\nall {len(cases)} at once on one thread pool: {total:.2f} s in all (slowest case "
          f"{max(r[2] for r in results):.2f} s, sum of cases {sum(r[2] for r in results):.2f} s)")


if __name__ == "__main__":
    main()
