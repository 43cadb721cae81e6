"""Does the recipe learn on every seed? GRPO (examples/grpo_arith) and PPO (hybridflow quickstart) over seeds.

Each run is its own process (one torch thread), exactly what a user runs:

    grpo: python examples/grpo_arith/train.py --seed S --out DIR [--steps N]
    ppo:  hybridflow quickstart --seed S --out DIR [--steps N] [--time-budget T] (its own budget by default)

and is read back from its ``metrics.jsonl``. Printed per seed: the greedy accuracy over the
100 prompts before RL and at the end, the step and the seconds of RL steps (the sum of
``timing_s/step``, validation excluded) at which 0.5 and 0.9 were first reached, the steps
run and the wall time of the process; then one summary line per algorithm: how many seeds
reached 0.5 / 0.9, the median time to 0.9, and the smallest gain.

    python tools/bench_learning.py                      # both algorithms, seeds 0-4
    python tools/bench_learning.py --algo grpo --seeds 7 # one seed (a CI job can sample one)
    python tools/bench_learning.py --algo dapo,cispo --seeds 0,1   # other algorithms, grpo_arith's recipe
    python tools/bench_learning.py --jobs 2             # two runs at a time (noisier seconds)
    python tools/bench_learning.py --algo grpo --staleness 2   # generation 2 steps ahead, on Ray (a pool of its own)
    python tools/bench_learning.py --algo grpo --seeds 0,1,2 --lora-rank 16 --lr 2e-3   # LoRA adapters only
    .venv-vllm/bin/python tools/bench_learning.py --algo grpo --seeds 0,1,2 --heads 2 --rollout-engine hf,vllm
                                                        # vLLM vs transformers rollouts, same seeds and model

Measured with grpo_arith's recipe before its entropy bonus (1 thread per run, 2 runs at a time on the
shared 2-core machine; dapo and cispo have no entropy_coef attribute, so the bonus does not apply to them):
dapo seeds 0/1 0.08 -> 0.96 / 0.90 greedy (0.5 at step 125 / 250), 38 % / 73 % of groups dropped
per step, 1.27 / 1.67 extra generation rounds; cispo seeds 0/1 0.08 -> 1.00 / 0.97 (0.5 at 150 / 125).

With ``--heads 2 --rollout-engine hf,vllm`` (seeds 0-2, in .venv-vllm, before the entropy bonus): both engines reached 0.9 on 3/3
seeds, hf at steps 325 / 425 / 350, vllm at 250 / 475 / 475 (docs/rollout_engines.md).

The grpo_arith recipe's entropy bonus went from 0.01 to 0.05 after 2 of 10 seeds plateaued at 0.89 on an AVX2
CPU (its docstring has the sweeps); the figures below are of the recipe at 0.01, or before its bonus where they say so.

Measured with the recipes as they were (``--jobs 2``, shared 2-core machine): grpo 0.9 on 5/5 seeds
(0-4: steps 225 / 400 / 575 / 275 / 250, median 19.1 s of RL steps, finals 0.95-0.98); ppo 0.9 on
5/5 (steps 200-320, median 46.2 s, finals 0.96-0.98, smallest gain +0.88).

LoRA (``--algo grpo --seeds 0,1,2 --lora-rank 16 --jobs 2``: rank 16, alpha 32, every linear layer of
the blocks, lr 4e-3, the recipe otherwise unchanged; 127k-parameter model, 45k adapter parameters):
0.9 on 3/3 seeds, at steps 525 / 575 / 825 (66.5 / 71.2 / 80.7 s of RL steps), finals 0.95 / 0.97 / 0.96.
At lr 1e-2 seeds 0 and 1 did not learn in 200 steps (the KL to the base model jumped to 2.4 at step 31).

Stale GRPO (``--staleness K``, Ray, one run at a time on the shared 2-core machine; the recipe's PPO
ratio is taken against the rollout's own log-probs, and "clipped" is the share of response tokens its clip
dropped, see :func:`correction_of`): k = 2, seeds 0-4: 0.9 on 5/5 (steps 275 / 450 / 425 / 225 / 225,
finals 0.96-0.98), 0.078-0.095 of the tokens clipped; k = 4: 0.9 on 4/5 within the recipe's 1,000 steps
(seeds 0-3 at 375 / 375 / 550 / 500, finals 0.95-0.97, 0.082-0.121 clipped; seed 4 0.84 at step 1,000,
0.037 clipped).

With ``--staleness 4 --steps 2000`` (the LR schedule spans 2,000 steps): 0.9 on 5/5 (seeds 0-4 at
725 / 675 / 900 / 950 / 950, finals 0.95-0.96), 0.056-0.110 of the tokens clipped. Seed 0 at k = 1: 0.9
at step 150, 0.050 clipped; at k = 0 on Ray (``--executor ray``): step 300, nothing clipped. grpo_is and
grpo_decoupled (no KL loss, no entropy bonus) on seed 0 at k = 2: 0.10 and 0.14 after 1,000 steps (grpo_is
on-policy, local: 0.42).

Seconds depend on the machine and its load; steps do not. ``--json FILE`` writes every
curve.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
THRESHOLDS = (0.5, 0.9)


EXTRA_ARGS: dict[str, list[str]] = {"dapo": ["--response-length", "4"]}
"""Recipe arguments an algorithm needs beyond grpo_arith's (DAPO's overlong shaping penalises the budget's last token)."""


def command(algo: str, seed: int, out: Path, steps: int | None, time_budget: float | None, engine: str = "hf",
            heads: int | None = None, lora: tuple[int, float | None] = (0, None), staleness: int = 0,
            executor: str = "local") -> list[str]:
    if algo != "ppo":  # grpo, or any standard algorithm trained with the grpo_arith recipe
        cmd = [sys.executable, str(ROOT / "examples" / "grpo_arith" / "train.py"), "--seed", str(seed), "--out", str(out)]
        cmd += ["--algorithm", algo, *EXTRA_ARGS.get(algo, [])] if algo != "grpo" else []
        cmd += ["--rollout-engine", engine] + (["--heads", str(heads)] if heads else [])
        cmd += ["--lora-rank", str(lora[0])] if lora[0] else []
        cmd += ["--lr", str(lora[1])] if lora[1] else []
        cmd += ["--staleness", str(staleness)] if staleness else []
        cmd += ["--executor", executor] if executor != "local" else []
    else:
        cmd = [sys.executable, "-m", "hybridflow.cli", "quickstart", "--seed", str(seed), "--out", str(out)]
        cmd += ["--time-budget", str(time_budget)] if time_budget is not None else []
    return cmd + (["--steps", str(steps)] if steps else [])


def curve_of(metrics_file: Path) -> list[tuple[int, float, float]]:
    """(step, seconds of RL steps so far, greedy accuracy) at every validation, from a metrics.jsonl."""
    curve, seconds = [], 0.0
    for line in metrics_file.read_text().splitlines():
        record = json.loads(line)
        seconds += record.get("timing_s/step", 0.0)
        if "val/score/greedy" in record:
            curve.append((int(record["step"]), round(seconds, 1), float(record["val/score/greedy"])))
    return curve


def dynamic_sampling_of(metrics_file: Path) -> dict | None:
    """Means over the run's steps of a dynamic-sampling algorithm's metrics (DAPO), None for the others."""
    steps = [r for r in map(json.loads, metrics_file.read_text().splitlines()) if "dynamic_sampling/rounds" in r]
    if not steps:
        return None
    mean = lambda key: round(statistics.mean(r[f"dynamic_sampling/{key}"] for r in steps), 3)
    return {"dropped_group_frac": mean("dropped_group_frac"), "extra_rounds": mean("extra_rounds"),
            "filled_frac": mean("filled_frac"), "max_extra_rounds": max(r["dynamic_sampling/extra_rounds"] for r in steps)}


def correction_of(metrics_file: Path) -> dict | None:
    """What the off-policy correction did over the run, None where no step logged the PPO clip.

    ``clipped_token_frac``: the share of the run's response tokens whose policy-gradient term the PPO clip
    zeroed, the recipe's correction of stale rollouts: ``actor/pg_clipfrac`` (valid tokens where the clipped
    term of ``max(-A r, -A clip(r, 1 - eps, 1 + eps))`` is taken, which has no gradient; ``r`` is the trained
    policy over the rollout's own log-probs) weighted by each step's response tokens
    (``response_length/mean``; every step has the same number of responses). With one mini-batch and one
    epoch (the recipe) the ratio of an on-policy step is exactly 1 and nothing is clipped, so the share is what
    the lag costs. ``staleness``: the mean of ``rollout/staleness`` over the steps (the lag in updates).
    An algorithm that corrects with importance weights instead (``grpo_is``, ``grpo_decoupled``: its clip is
    around a recomputed policy, so the share above is not its correction) also gets ``mean_is_weight``: the
    mean over the steps of its weight op's ``.../is_weights/mean``.
    """
    steps = [r for r in map(json.loads, metrics_file.read_text().splitlines()) if "actor/pg_clipfrac" in r]
    if not steps:
        return None
    tokens = [r.get("response_length/mean", 1.0) for r in steps]
    clipped = sum(r["actor/pg_clipfrac"] * t for r, t in zip(steps, tokens)) / max(sum(tokens), 1e-12)
    result = {"clipped_token_frac": round(clipped, 4), "max_step_clipped_frac": round(max(r["actor/pg_clipfrac"] for r in steps), 4),
              "staleness": round(statistics.mean(r.get("rollout/staleness", 0.0) for r in steps), 3)}
    weights = [v for r in steps for k, v in r.items() if k.endswith("/is_weights/mean")]
    if weights:
        result["mean_is_weight"] = round(statistics.mean(weights), 4)
    return result


def first_reached(curve, threshold: float):
    return next(((step, seconds) for step, seconds, acc in curve if acc >= threshold), None)


def run_one(algo: str, seed: int, root: Path, steps: int | None, time_budget: float | None, engine: str = "hf",
            heads: int | None = None, lora: tuple[int, float | None] = (0, None), staleness: int = 0,
            executor: str = "local") -> dict:
    """One run; ``algo`` in the results is ``<algo>/<engine>`` for a rollout engine other than hf, with
    ``+lora<rank>`` for a LoRA run, ``@k<k>`` for a run at staleness k and ``@ray`` for one on Ray at k = 0."""
    label = (algo if engine == "hf" else f"{algo}/{engine}") + (f"+lora{lora[0]}" if lora[0] else "")
    label += f"@k{staleness}" if staleness else ("@ray" if executor == "ray" else "")
    out = root / f"{label.replace('/', '_')}_seed{seed}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    start = time.perf_counter()
    proc = subprocess.run(command(algo, seed, out, steps, time_budget, engine, heads, lora, staleness, executor), cwd=ROOT, env=env,
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        return {"algo": label, "seed": seed, "error": proc.stderr.strip().splitlines()[-1:] or ["(no output)"], "wall_s": wall}
    curve = curve_of(out / "metrics.jsonl")
    return {"algo": label, "seed": seed, "curve": curve, "wall_s": round(wall, 1), "before": curve[0][2],
            "final": curve[-1][2], "steps": curve[-1][0],
            "reached": {str(t): first_reached(curve, t) for t in THRESHOLDS},
            "dynamic_sampling": dynamic_sampling_of(out / "metrics.jsonl"), "correction": correction_of(out / "metrics.jsonl")}


def _cell(hit) -> str:
    return f"{hit[0]:>5d} {hit[1]:>6.1f}" if hit else f"{'-':>5} {'-':>6}"


def report(results: list[dict]) -> None:
    print(f"{'algo':8} {'seed':>4} {'before':>6} {'final':>6}   {'@0.5 step':>9} {'s':>4}   {'@0.9 step':>9} {'s':>4}"
          f"   {'steps':>5} {'wall_s':>6}")
    for r in results:
        if "error" in r:
            print(f"{r['algo']:8} {r['seed']:>4}  FAILED: {r['error'][0]}")
            continue
        print(f"{r['algo']:8} {r['seed']:>4} {r['before']:>6.2f} {r['final']:>6.2f}   {_cell(r['reached']['0.5']):>16}"
              f"   {_cell(r['reached']['0.9']):>16}   {r['steps']:>5} {r['wall_s']:>6.1f}")
        if r.get("correction") and (r["correction"]["staleness"] or r["correction"]["clipped_token_frac"]):
            c = r["correction"]
            print(f"{'':8} correction: {c['clipped_token_frac']:.4f} of response tokens clipped by the PPO ratio (no gradient; "
                  f"most in one step {c['max_step_clipped_frac']:.3f}), mean lag {c['staleness']:.2f} updates"
                  + (f", mean IS weight {c['mean_is_weight']:.3f}" if "mean_is_weight" in c else ""))
        if r.get("dynamic_sampling"):
            ds = r["dynamic_sampling"]
            print(f"{'':8} dynamic sampling, mean per step: {ds['dropped_group_frac']:.3f} of groups dropped, "
                  f"{ds['extra_rounds']:.2f} extra rounds (max {ds['max_extra_rounds']:.0f}), batch {ds['filled_frac']:.3f} filled")
    for algo in dict.fromkeys(r["algo"] for r in results):
        ok = [r for r in results if r["algo"] == algo and "error" not in r]
        n = len([r for r in results if r["algo"] == algo])
        at = {t: [r["reached"][str(t)] for r in ok if r["reached"][str(t)]] for t in THRESHOLDS}
        median = statistics.median(s for _, s in at[0.9]) if at[0.9] else float("nan")
        median_steps = statistics.median(st for st, _ in at[0.9]) if at[0.9] else float("nan")
        gain = min((r["final"] - r["before"] for r in ok), default=float("nan"))
        clipped = [r["correction"]["clipped_token_frac"] for r in ok if r.get("correction")]
        share = f"; tokens clipped {min(clipped):.4f}-{max(clipped):.4f}" if clipped and any(clipped) else ""
        print(f"summary {algo}: reached 0.5 on {len(at[0.5])}/{n} seeds, 0.9 on {len(at[0.9])}/{n}; median time to 0.9 "
              f"{median:.1f} s ({median_steps:.0f} steps); smallest gain {gain:+.2f}; failed runs {n - len(ok)}{share}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algo", default="both",
                        help="grpo, ppo, both (grpo and ppo), or any algorithm of hybridflow.algorithms, or several "
                             "comma-separated (dapo,cispo): trained with the grpo_arith recipe")
    parser.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated seeds (default 0-4)")
    parser.add_argument("--steps", type=int, default=None, help="override each recipe's step count")
    parser.add_argument("--ppo-time-budget", type=float, default=None,
                        help="the quickstart's --time-budget (default: its own, 140 s; 0: none, run all its steps)")
    parser.add_argument("--rollout-engine", default="hf",
                        help="hf, vllm, or hf,vllm (both, same seeds; vllm needs .venv-vllm/bin/python and --heads 2); "
                             "grpo_arith recipe only")
    parser.add_argument("--heads", type=int, default=None,
                        help="attention heads of the grpo_arith model (default: its own, 4; 2 gives head_dim 32 for vLLM)")
    parser.add_argument("--lora-rank", type=int, default=0,
                        help="grpo_arith recipe: train LoRA adapters of this rank (alpha 2 x rank) instead of every weight")
    parser.add_argument("--lr", type=float, default=None, help="grpo_arith recipe: peak actor learning rate (its default otherwise)")
    parser.add_argument("--staleness", type=int, default=0,
                        help="grpo_arith recipe: generation up to K steps ahead of training (k >= 1 needs --executor ray; "
                             "generation gets a pool of its own); the PPO ratio against the rollout's log-probs corrects the lag")
    parser.add_argument("--executor", default=None, choices=("local", "ray"),
                        help="grpo_arith recipe: local or ray (default: ray with --staleness >= 1, else local)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (each uses one torch thread)")
    parser.add_argument("--out", default="runs/bench_learning", help="folder of the runs")
    parser.add_argument("--json", default=None, help="write every result (with its curve) to this file")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    algos = ("grpo", "ppo") if args.algo == "both" else tuple(a.strip() for a in args.algo.split(",") if a.strip())
    sys.path.insert(0, str(ROOT))
    from hybridflow.algorithms import ALGORITHMS

    unknown = [a for a in algos if a not in ALGORITHMS]
    if unknown:
        parser.error(f"unknown algorithm(s) {', '.join(unknown)}; the standard ones are {', '.join(ALGORITHMS)}")
    engines = tuple(e.strip() for e in args.rollout_engine.split(",") if e.strip())
    if set(engines) - {"hf", "vllm"}:
        parser.error(f"--rollout-engine: {args.rollout_engine!r}; choose hf, vllm or hf,vllm")
    if "ppo" in algos and (args.lora_rank or args.lr):
        parser.error("--lora-rank and --lr apply to the grpo_arith recipe, not the ppo quickstart")
    if "ppo" in algos and engines != ("hf",):
        parser.error("--rollout-engine applies to the grpo_arith recipe; the ppo quickstart samples with hf")
    executor = args.executor or ("ray" if args.staleness else "local")
    if args.staleness < 0 or (args.staleness and executor != "ray"):
        parser.error(f"--staleness {args.staleness}: a staleness k >= 1 runs generation ahead on Ray; add --executor ray "
                     "(or leave --executor out), and k must not be negative")
    if "ppo" in algos and (args.staleness or executor != "local"):
        parser.error("--staleness and --executor apply to the grpo_arith recipe, not the ppo quickstart")
    jobs = [(algo, engine, seed) for algo in algos for seed in seeds for engine in engines]
    root = Path(args.out).resolve()
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(lambda job: run_one(job[0], job[2], root, args.steps, args.ppo_time_budget, job[1],
                                                    args.heads, (args.lora_rank, args.lr), args.staleness,
                                                    executor), jobs))
    report(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
