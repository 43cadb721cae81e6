"""hybridflow's GRPO side by side with TRL's GRPOTrainer, at equal settings.

    python tools/bench_vs_trl.py learn [--seeds 0 1 2] [--steps 300] [--prompts 50] [--group 16]
                                       [--eval-every 25] [--out runs/bench_vs_trl] ...
    python tools/bench_vs_trl.py speed [--steps 20] [--rounds 2] [--threads 1] ...
    python tools/bench_vs_trl.py replay [--seed 0] [--steps 60] ...

Learning mode (``learn``): for each seed, one model folder made by hybridflow (the
built-in task's tiny model: random weights + the 40-step format warm-up on wrong
answers, as hybridflow.trainer.setup makes it), then one run of each framework from it,
one after the other, each in its own process with the same thread count:

- hybridflow: tools/bench_trl/hybridflow_runner.py with hybridflow's Python,
- TRL: tools/bench_trl/trl_runner.py inside a side virtual environment (``.venv-trl``,
  git-ignored, made by ``--make-trl-venv`` with TRL ``TRL_VERSION`` over this environment's
  torch version; TRL is never a dependency of hybridflow). Without it a mode that runs TRL
  stops and says how to make it; ``learn --sides hybridflow`` runs hybridflow's side alone.

Equal settings: same model folder, prompts (all 100 ``a+b=``, ``--prompts`` per step,
reshuffled every epoch; the same prompts at every step on both sides: hybridflow draws TRL's
RepeatSampler order, ``--own-prompt-order`` keeps its own, and the records' per-step prompt lists
are compared), group size, 3 new tokens, temperature 1 with no top-k / top-p /
repetition penalty, reward (exact sum then EOS scores 1; no EOS within the limit scores
0; the same function, tools/bench_trl/common.py, on both sides), group-std-scaled
advantages, PPO clip 0.2, no KL, token-mean loss over the step's tokens (TRL "dapo"),
one optimizer step per generation batch, AdamW (lr, betas, eps 1e-8, no weight decay),
gradient clipping 1.0, fp32 (TRL's GRPOConfig defaults to bf16: turned off), constant
learning rate (TRL's default is a linear decay to 0: ``--lr-schedule linear`` gives
both sides that), same thread count.

Recorded per step (JSON in --out): gradient norm before clipping, entropy, mean response
length (EOS included), mean reward, learning rate; greedy accuracy on all 100 prompts
every ``--eval-every`` steps with the same code on both sides. Printed: per seed, the
accuracy of both at each evaluation, counts of gradient norms above 1, the largest, and
entropy / length / reward over the last 10 steps; then the mean over seeds.

Speed mode (``speed``): both frameworks on the same model folder (``--size tiny``, ``10m`` or ``100m``,
``--new-tokens`` the response limit), prompts, reward rule,
group size, lengths, learning rate and thread count, run alternately for ``--rounds`` (default 3)
rounds of ``--steps`` steps each (hybridflow with its zero-advantage row skipping on, then
off, then TRL). The model folder (``--model spread``, the default) has random weights whose EOS
logit is set so that sampled responses average half of ``--new-tokens``, spread geometrically over
the budget (tools/bench_trl/common.py, set_stop_logits): a step's work is then decoding and training
on responses of realistic length (``--model warm``, the task's warmed-up model, answers in ~2 tokens
and measures the fixed per-step costs). Its rewards are all 0 (random answers), so every group's
advantages vanish: with skipping on hybridflow skips the whole update, the best case of skipping;
the skipping-off side does the full work TRL does. No ratio to TRL is printed for a side whose mean
response length differs from TRL's by more than 5% (different work). Also printed: this CPU's fp32
matmul peak (tools/bench_trl/flops.py, process CPU time, same thread count) and each side's achieved
GFLOP/s of generation and of the rest of the step (the update) as a fraction of it. Hybridflow's
runs leave calibration out (``calibrate=False``: the steps are timed, not the start-up).
Printed: the median seconds per step (the first ``--skip`` steps of a run left
out) on the wall clock and in process CPU time (with one thread the figure to read on a busy
machine: what the step computed, not the time the scheduler gave to others), the mean response
length (each side stops a row at EOS), response tokens per second, process CPU microseconds per
generated response token (all steps' CPU over all their tokens: tools/bench_trl/speed_table.py), peak
RSS of the run's process, and ratios to TRL (wall, CPU, CPU per token).
Disturbed runs: each round's median wall/CPU ratio is printed beside its CPU s/step and load
average; with one thread a round above 1.3 (its process was kept off its core by others) is
flagged and left out of the medians, unless every round of that side was (tools/bench_trl/speed_table.py).
``--baseline-tree DIR`` (another checkout, e.g. of main) adds its runner and package as the sides
``baseline`` and ``baseline_noskip``, run in the same rounds: a change's before and after, interleaved.

Equal work: the two sides sample different responses, and once they train their response lengths
drift apart (the step's cost grows with them), so at the default learning rate the per-step ratio
mixes speed with what each side happened to learn. ``--lr 0`` keeps both models at the folder's
weights: every step then samples from the same distribution on both sides (mean response lengths
agree up to sampling noise, e.g. 2.44 vs 2.41 tokens on tiny at 8 x 8) and s/step compares equal work;
the CPU-per-token column is the comparison to read at a nonzero rate.

Replay mode (``replay``): one hybridflow run recorded step by step (batch, weights,
gradient), then TRL's loss on each recorded batch at the recorded weights (relative
gradient difference), and TRL's optimizer, training_step and clipping fed the recorded
batches from step 0 (relative weight difference after each step): whether the two compute
the same update, apart from what they sample.

``learn --streams N``: the sampling stream alone spreads a run's accuracy as much as the
framework does, so this runs N streams per side on each seed's model folder (stream k of seed s:
hybridflow's ``sampling_seed`` and TRL's ``reseed`` both ``1000 s + 1 + k``; two sides of a stream
one after the other, or together with ``--jobs 2``) and prints, every ``--checkpoint-every`` steps,
each side's mean / median / sd of greedy accuracy, the difference of the means with its standard
error and a bootstrap interval, Mann-Whitney's P(ours > TRL), then collapsed runs, gradient-norm
spikes and final entropy per side, and a verdict (tools/bench_trl/parity.py).

``--hf-variant`` / ``--trl-variant`` take JSON switches for diagnosis runs (see the
runners' docstrings), and ``--tag`` names such a run's files. Records that exist are
reused unless ``--fresh``.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNNERS = Path(__file__).resolve().parent / "bench_trl"
sys.path.insert(0, str(RUNNERS))
from common import RunConfig  # noqa: E402
from flops import matmul_peak  # noqa: E402
from parity import compare_streams, print_comparison  # noqa: E402
from speed_table import (add_arithmetic, print_arithmetic, print_speed, speed_figures, undisturbed,  # noqa: E402
                         wall_over_cpu)
from trl_venv import TRL_VENV, TRL_VERSION, ensure_trl_venv, missing_trl  # noqa: E402


# ----------------------------------------------------------------------------- running

def _env(threads: int, root: Path = ROOT) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(root)}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def make_model(path: Path, seed: int, threads: int, size: str = "tiny", lengths: int = 0) -> Path:
    """The model folder at ``path`` (made once): the warmed-up task model, or with ``lengths`` the speed one."""
    if not (path / "config.json").exists():
        done = subprocess.run([sys.executable, str(RUNNERS / "hybridflow_runner.py"), "--make-model", str(path), "--seed",
                               str(seed), "--size", size, "--lengths", str(lengths)], check=True, env=_env(threads),
                              capture_output=True, text=True)
        print("\n".join(line for line in done.stdout.splitlines() if line.startswith("mean sampled")), flush=True)
    return path


def run_side(python: str, runner: str, cfg: RunConfig, fresh: bool, root: Path = ROOT) -> dict:
    """One run of one side (skipped when its record exists, unless fresh); returns the record.

    ``root``: the hybridflow checkout whose runner (``root/tools/bench_trl/runner``) and package run it.
    """
    out = Path(cfg.out)
    if fresh or not out.exists():
        cfg_path = out.with_suffix(".config.json")
        cfg.save(cfg_path)
        log = out.with_suffix(".log")
        with open(log, "w") as sink:
            done = subprocess.run([python, str(root / RUNNERS.relative_to(ROOT) / runner), str(cfg_path)],
                                  env=_env(cfg.threads, root), stdout=sink, stderr=subprocess.STDOUT)
        if done.returncode != 0:
            raise SystemExit(f"{runner} failed (exit {done.returncode}); see {log}")
    return json.loads(out.read_text())


# ----------------------------------------------------------------------------- reports

def summarise(record: dict) -> dict:
    """Figures of one run: accuracy by step, gradient norms above 1, end-of-run entropy / length / reward."""
    steps = record["steps"]
    norms = [s["grad_norm"] for s in steps if "grad_norm" in s]
    tail = steps[-10:]

    def tail_mean(key):
        values = [s[key] for s in tail if key in s]
        return statistics.fmean(values) if values else float("nan")

    prompts = [s.get("prompts") for s in steps]
    digest = hashlib.sha256(json.dumps(prompts).encode()).hexdigest()[:16] if steps and None not in prompts else None
    return {"acc": {e["step"]: e["greedy_accuracy"] for e in record["evals"]}, "prompt_digest": digest,
            "grad_gt1": sum(n > 1.0 for n in norms), "grad_max": max(norms, default=float("nan")),
            "steps": len(steps), "entropy_end": tail_mean("entropy"), "length_end": tail_mean("response_length"),
            "reward_end": tail_mean("reward"), "s_per_step": statistics.median([s["time_s"] for s in steps]) if steps else 0.0}


def print_seed(seed: int, figures: dict[str, dict]) -> None:
    sides = list(figures)
    print(f"\nseed {seed}: greedy accuracy on 100 prompts")
    print("  step " + "".join(f"{side:>12}" for side in sides))
    for step in sorted(set().union(*(f["acc"] for f in figures.values()))):
        print(f"  {step:4d} " + "".join(f"{figures[s]['acc'].get(step, float('nan')):12.2f}" for s in sides))
    print("  " + "  ".join(f"{s}: grad>1 {f['grad_gt1']}/{f['steps']} (max {f['grad_max']:.1f}), end entropy "
                           f"{f['entropy_end']:.2f} length {f['length_end']:.2f} reward {f['reward_end']:.2f}, "
                           f"{f['s_per_step']:.2f} s/step" for s, f in figures.items()))


def _sem(values: list[float]) -> float:
    """Standard error of the mean (nan for fewer than 2 values)."""
    return statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else float("nan")


def print_summary(per_seed: dict[int, dict[str, dict]]) -> dict:
    sides = list(next(iter(per_seed.values())))
    steps = sorted(set.intersection(*(set(f["acc"]) for figs in per_seed.values() for f in figs.values())))
    mean = {side: {step: statistics.fmean(figs[side]["acc"][step] for figs in per_seed.values()) for step in steps}
            for side in sides}
    print(f"\nmean over {len(per_seed)} seeds: greedy accuracy +- standard error"
          + (f"; {sides[0]} - {sides[1]} paired by seed (same model folder)" if len(sides) == 2 else ""))
    print("  step " + "".join(f"{side:>16}" for side in sides) + ("          paired" if len(sides) == 2 else ""))
    for step in steps:
        line = "".join(f"{mean[s][step]:9.3f} +- {_sem([f[s]['acc'][step] for f in per_seed.values()]):.3f}"
                       for s in sides)
        if len(sides) == 2:
            diff = [f[sides[0]]["acc"][step] - f[sides[1]]["acc"][step] for f in per_seed.values()]
            line += f"  {statistics.fmean(diff):+7.3f} +- {_sem(diff):.3f}"
        print(f"  {step:4d} " + line)
    totals = {side: {"grad_gt1": sum(figs[side]["grad_gt1"] for figs in per_seed.values()),
                     "steps": sum(figs[side]["steps"] for figs in per_seed.values()),
                     "final_acc": statistics.fmean(figs[side]["acc"][steps[-1]] for figs in per_seed.values()),
                     "mean_acc": statistics.fmean(mean[side].values())} for side in sides}
    for side, t in totals.items():
        print(f"  {side}: grad>1 in {t['grad_gt1']} of {t['steps']} steps; accuracy at the end {t['final_acc']:.3f}, "
              f"mean over evaluations {t['mean_acc']:.3f}")
    return {"mean_accuracy": mean, "totals": totals}


# ----------------------------------------------------------------------------- learning mode

def learn(args) -> dict:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    hf_variant = json.loads(args.hf_variant)
    if "trl" in args.sides and not args.own_prompt_order:  # the same prompts at every step on both sides
        hf_variant.setdefault("trl_prompt_order", True)
    sides = {"hybridflow": (sys.executable, "hybridflow_runner.py", hf_variant)}
    if "trl" in args.sides:
        sides["trl"] = (str(ensure_trl_venv(Path(args.trl_venv), args.make_trl_venv)), "trl_runner.py",
                        json.loads(args.trl_variant))
    if "hybridflow" not in args.sides:
        del sides["hybridflow"]
    base = RunConfig(model_dir="", out="", steps=args.steps, prompts=args.prompts, group=args.group, lr=args.lr,
                     lr_schedule=args.lr_schedule, betas=(args.beta1, args.beta2), eval_every=args.eval_every,
                     threads=args.threads)
    tag = f"_{args.tag}" if args.tag else ""
    if args.streams:
        return learn_streams(args, sides, base, out, tag)
    per_seed: dict[int, dict[str, dict]] = {}
    for seed in args.seeds:
        model_dir = make_model(out / f"model_seed{seed}", seed, args.threads)
        per_seed[seed] = {}
        for side, (python, runner, variant) in sides.items():
            cfg = replace(base, model_dir=str(model_dir), seed=seed, variant=variant,
                          out=str(out / f"{side}{tag}_seed{seed}.json"))
            print(f"seed {seed}: {side}{tag} ...", flush=True)
            per_seed[seed][side] = summarise(run_side(python, runner, cfg, args.fresh))
        print_seed(seed, per_seed[seed])
    summary = {"settings": vars(args), "trl_version": TRL_VERSION, "per_seed": per_seed, **print_summary(per_seed)}
    (out / f"summary{tag}.json").write_text(json.dumps(summary, indent=1, default=str))
    print(f"\nrecords and summary{tag}.json in {out}")
    return summary


def stream_seed(model_seed: int, stream: int) -> int:
    """The sampling seed of stream ``stream`` (0, 1, ...) on model seed ``model_seed``'s folder."""
    return 1000 * model_seed + 1 + stream


def learn_streams(args, sides: dict, base: RunConfig, out: Path, tag: str) -> dict:
    """``--streams N``: N sampling streams per side on each model folder, both sides interleaved.

    Stream k on model seed s samples from seed ``stream_seed(s, k)`` on both sides (hybridflow's
    ``sampling_seed``, TRL's ``reseed``; the model folder, data order and everything else as in
    the plain mode), and the runs are compared as distributions (tools/bench_trl/parity.py).
    """
    from concurrent.futures import ThreadPoolExecutor

    if len(sides) != 2:
        raise SystemExit("--streams compares two sides: leave --sides at hybridflow trl")
    if args.checkpoint_every % args.eval_every:
        raise SystemExit(f"--checkpoint-every {args.checkpoint_every} must be a multiple of --eval-every {args.eval_every}")
    switch = {"hybridflow": "sampling_seed", "trl": "reseed"}
    jobs = []  # (seed, side, config) in the order they run: both sides of stream 0, then of stream 1, ...
    for seed in args.seeds:
        model_dir = make_model(out / f"model_seed{seed}", seed, args.threads)
        for k in range(args.first_stream, args.first_stream + args.streams):
            s = stream_seed(seed, k)
            for side, (python, runner, variant) in sides.items():
                cfg = replace(base, model_dir=str(model_dir), seed=seed, variant={**variant, switch[side]: s},
                              out=str(out / f"{side}{tag}_seed{seed}_stream{s}.json"))
                jobs.append((seed, side, python, runner, cfg))

    def one(job):
        seed, side, python, runner, cfg = job
        print(f"seed {seed} {Path(cfg.out).stem} ...", flush=True)
        return seed, side, summarise(run_side(python, runner, cfg, args.fresh))

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        done = list(pool.map(one, jobs))
    runs = {side: [f for _, s, f in done if s == side] for side in sides}
    digests = list(zip(*([f["prompt_digest"] for f in side_runs] for side_runs in runs.values())))
    same = sum(d[0] is not None and d[0] == d[1] for d in digests)
    print(f"same prompts at every step on both sides: {same} of {len(digests)} streams"
          + ("" if same == len(digests) else " (hybridflow's --hf-variant '{\"trl_prompt_order\": true}' draws TRL's order)"))
    checkpoints = list(range(0, args.steps + 1, args.checkpoint_every))
    result = compare_streams(runs, checkpoints)
    print_comparison(result, f"greedy accuracy over {args.streams} sampling streams x model seeds {args.seeds} per side "
                             f"({len(runs['hybridflow'])} runs each), {args.steps} steps")
    for seed in args.seeds:
        last = {side: [f["acc"][checkpoints[-1]] for run_seed, run_side_, f in done if run_seed == seed and run_side_ == side]
                for side in sides}
        print(f"  model seed {seed}, step {checkpoints[-1]}: " + "; ".join(
            f"{side} " + " ".join(f"{v:.2f}" for v in values) for side, values in last.items()))
    summary = {"settings": vars(args), "trl_version": TRL_VERSION, "runs": runs, **result}
    name = f"summary_streams{tag}" + (f"_from{args.first_stream}" if args.first_stream else "")
    (out / f"{name}.json").write_text(
        json.dumps(summary, indent=1, default=lambda o: vars(o) if hasattr(o, "__dict__") else str(o)))
    print(f"\nrecords and {name}.json in {out}")
    return summary


# ----------------------------------------------------------------------------- speed mode

def speed(args) -> dict:
    import tempfile

    tree = Path(args.baseline_tree).resolve() if args.baseline_tree else None
    if tree is not None and not (tree / RUNNERS.relative_to(ROOT) / "hybridflow_runner.py").exists():
        raise SystemExit(f"--baseline-tree {tree} is not a hybridflow checkout (no tools/bench_trl/hybridflow_runner.py); "
                         "make one with e.g. 'git worktree add /tmp/base main'")
    trl_python = str(ensure_trl_venv(Path(args.trl_venv), args.make_trl_venv))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    folder = f"model_seed{args.seed}" if args.size == "tiny" else f"model_{args.size}_seed{args.seed}"
    lengths = args.new_tokens if args.model == "spread" else 0
    if lengths:
        folder = f"model_{args.size}_spread{lengths}_seed{args.seed}"
    model_dir = make_model(out / folder, args.seed, args.threads, args.size, lengths)
    peak = matmul_peak(args.threads)
    # the steps are timed, not the start-up: calibration (it feeds the plan's predicted times) is left out
    quick = {"config": {"calibrate": False}}
    noskip = {**quick, "train": {"skip_vanishing_rows": False}}
    sides = {"hybridflow": (sys.executable, "hybridflow_runner.py", quick, ROOT),
             "hybridflow_noskip": (sys.executable, "hybridflow_runner.py", noskip, ROOT),
             "trl": (trl_python, "trl_runner.py", {}, ROOT)}
    if tree is not None:  # another checkout's runner and package, in the same rounds: a change's before and after
        sides.update(baseline=(sys.executable, "hybridflow_runner.py", quick, tree),
                     baseline_noskip=(sys.executable, "hybridflow_runner.py", noskip, tree))
    for extra in args.extra_side:  # NAME=JSON: one more hybridflow side with these variant switches
        name, _, variant = extra.partition("=")
        sides[name] = (sys.executable, "hybridflow_runner.py", {**quick, **json.loads(variant or "{}")}, ROOT)
    base = RunConfig(model_dir=str(model_dir), out="", seed=args.seed, steps=args.steps, prompts=args.prompts,
                     group=args.group, lr=args.lr, eval_every=0, threads=args.threads,
                     max_new_tokens=args.new_tokens)
    rounds: dict[str, list[list[dict]]] = {side: [] for side in sides}  # each round's step records
    per_round: dict[str, list[tuple[float, float]]] = {side: [] for side in sides}  # (CPU s/step, load average)
    rss: dict[str, float] = {side: 0.0 for side in sides}
    with tempfile.TemporaryDirectory(dir=out) as scratch:
        for r in range(args.rounds):
            for side, (python, runner, variant, root) in sides.items():
                print(f"round {r + 1}: {side} ...", flush=True)
                record = run_side(python, runner, replace(base, variant=variant, out=f"{scratch}/{side}_{r}.json"), True,
                                  root)
                rounds[side].append(record["steps"][args.skip:])
                per_round[side].append((statistics.median(s.get("cpu_s", s["time_s"]) for s in record["steps"][args.skip:]),
                                        os.getloadavg()[0]))
                rss[side] = max(rss[side], record["peak_rss_mb"])
    steps, dropped = undisturbed(rounds, args.threads)
    result = speed_figures(steps, args.prompts * args.group)
    add_arithmetic(result, model_dir, (args.prompts, args.group))
    for side, (_, runner, variant, _) in sides.items():  # hybridflow sides with zero-advantage row skipping on
        result[side]["skips_rows"] = runner == "hybridflow_runner.py" and variant.get("train", {}).get(
            "skip_vanishing_rows", True) is not False
    for side in sides:
        result[side].update(peak_rss_mb=rss[side], cpu_s_per_round=[c for c, _ in per_round[side]],
                            load_per_round=[l for _, l in per_round[side]], disturbed_rounds=dropped[side],
                            wall_over_cpu_per_round=[wall_over_cpu(r) for r in rounds[side]])
    print(f"\n{args.size} model ({args.model}), {args.prompts} prompts x {args.group}, {args.new_tokens} new tokens, "
          f"{args.threads} thread(s), lr {args.lr:g}, {args.rounds} rounds of {args.steps} steps "
          f"(first {args.skip} of each left out); load average {os.getloadavg()[0]:.1f}")
    print_speed(result)
    print_arithmetic(result, peak)
    print("  CPU s/step of each round (load average after it, wall/CPU); * disturbed (one thread, wall/CPU above "
          "1.3): left out of the medians above unless all of a side's rounds were")
    for side, r in result.items():
        print(f"  {side:18}" + "  ".join(f"{c:.4f} ({l:.1f}, {w:.2f}){'*' if i in r['disturbed_rounds'] else ''}"
                                          for i, (c, l, w) in enumerate(zip(r["cpu_s_per_round"], r["load_per_round"],
                                                                             r["wall_over_cpu_per_round"]))))
    (out / f"speed_{args.size}_{args.new_tokens}.json").write_text(
        json.dumps({"settings": vars(args), "trl_version": TRL_VERSION, "matmul_peak_gflops": peak, "result": result,
                    "step_records": rounds}, indent=1))
    return result


# ----------------------------------------------------------------------------- replay mode

def replay(args) -> None:
    trl_python = str(ensure_trl_venv(Path(args.trl_venv), args.make_trl_venv))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = make_model(out / f"model_seed{args.seed}", args.seed, args.threads)
    cfg = RunConfig(model_dir=str(model_dir), out=str(out / f"replay_seed{args.seed}_hybridflow.json"), seed=args.seed,
                    steps=args.steps, prompts=args.prompts, group=args.group, lr=args.lr, eval_every=10**9,
                    threads=args.threads)
    config, dump = out / f"replay_seed{args.seed}.config.json", out / f"replay_seed{args.seed}.pt"
    cfg.save(config)
    env = _env(args.threads)
    subprocess.run([sys.executable, str(RUNNERS / "replay_hybridflow.py"), str(config), str(dump)], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    result = out / f"replay_seed{args.seed}.json"
    done = subprocess.run([trl_python, str(RUNNERS / "replay_trl.py"), str(config), str(dump), str(result)], env=env,
                          capture_output=True, text=True)
    print(done.stdout)
    if done.returncode:
        raise SystemExit(f"replay_trl.py failed:\n{done.stderr[-3000:]}")
    dump.unlink()  # large: weights and gradients of every step


def main(argv=None) -> dict | None:
    """Run the chosen mode; returns learn's summary or speed's figures (replay prints its table)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    modes = parser.add_subparsers(dest="mode")
    p = modes.add_parser("learn", help="learning curves of both frameworks at equal settings")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="one model folder and one run per side each")
    p.add_argument("--steps", type=int, default=300, help="optimizer steps per run")
    p.add_argument("--prompts", type=int, default=50, help="prompts per step")
    p.add_argument("--group", type=int, default=16, help="responses per prompt")
    p.add_argument("--lr", type=float, default=2e-3, help="AdamW learning rate")
    p.add_argument("--lr-schedule", choices=("constant", "linear"), default="constant",
                   help="constant, or linear decay to 0 over --steps (TRL's TrainingArguments default)")
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.999)
    p.add_argument("--eval-every", type=int, default=25, help="greedy accuracy every this many steps")
    p.add_argument("--threads", type=int, default=1, help="torch threads of each run (runs are sequential)")
    p.add_argument("--sides", nargs="+", choices=("hybridflow", "trl"), default=["hybridflow", "trl"])
    p.add_argument("--hf-variant", default="{}", help="JSON switches for the hybridflow runner (diagnosis)")
    p.add_argument("--trl-variant", default="{}", help="JSON switches for the TRL runner (diagnosis)")
    p.add_argument("--own-prompt-order", action="store_true",
                   help="hybridflow draws its own prompt order (default beside TRL: TRL's RepeatSampler order, so "
                        "both sides train on the same prompts at every step)")
    p.add_argument("--tag", default="", help="name of a variant run's record files")
    p.add_argument("--streams", type=int, default=0,
                   help="N > 0: N sampling streams per side on each seed's model folder, compared as distributions")
    p.add_argument("--first-stream", type=int, default=0,
                   help="with --streams: the first stream's index (streams first .. first+N-1), to add streams to a study")
    p.add_argument("--checkpoint-every", type=int, default=50, help="with --streams: steps compared (a multiple of "
                   "--eval-every)")
    p.add_argument("--jobs", type=int, default=1, help="with --streams: runs at a time (2 runs both sides of a stream "
                   "together, each with --threads threads)")
    p.add_argument("--out", default="runs/bench_vs_trl", help="output folder")
    p.add_argument("--trl-venv", default=str(TRL_VENV), help="the side environment with TRL")
    p.add_argument("--make-trl-venv", action="store_true", help="make --trl-venv if it has no TRL (pip downloads it)")
    p.add_argument("--fresh", action="store_true", help="rerun runs whose record exists")
    p = modes.add_parser("speed", help="seconds per step, tokens/s and peak RSS of both, alternating")
    p.add_argument("--seed", type=int, default=0, help="the model folder's seed")
    p.add_argument("--steps", type=int, default=20, help="steps per run")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (each runs every side once)")
    p.add_argument("--skip", type=int, default=2, help="first steps of a run left out of the medians")
    p.add_argument("--prompts", type=int, default=50, help="prompts per step")
    p.add_argument("--group", type=int, default=16, help="responses per prompt")
    p.add_argument("--lr", type=float, default=2e-3, help="AdamW learning rate")
    p.add_argument("--threads", type=int, default=1, help="torch threads of each run")
    p.add_argument("--size", choices=("tiny", "10m", "100m"), default="tiny",
                   help="a standard bench model (hybridflow.data.tiny.BENCH_MODELS): the built-in task's tiny one "
                        "(~130k parameters), 10m (~7.9M) or 100m (~104M)")
    p.add_argument("--new-tokens", type=int, default=8, help="response length limit (the issue's settings: 8 on tiny, 64 on 10m)")
    p.add_argument("--model", choices=("spread", "warm"), default="spread",
                   help="spread: random weights whose EOS logit makes responses average half of --new-tokens, spread "
                        "over the budget (the work a step does is decoding and training on them); warm: the built-in "
                        "task's warmed-up model, which answers in ~2 tokens (the step's fixed costs)")
    p.add_argument("--extra-side", action="append", default=[], metavar="NAME=JSON",
                   help="another hybridflow side with these runner variant switches, e.g. "
                        "'joined={\"joined_forward\": true}' (repeatable)")
    p.add_argument("--baseline-tree", metavar="DIR", help="another hybridflow checkout (e.g. 'git worktree add /tmp/base "
                   "main'): its runner and package run as the sides baseline and baseline_noskip in the same rounds, "
                   "so a change's before and after are measured together")
    p.add_argument("--out", default="runs/bench_vs_trl", help="output folder")
    p.add_argument("--trl-venv", default=str(TRL_VENV), help="the side environment with TRL")
    p.add_argument("--make-trl-venv", action="store_true", help="make --trl-venv if it has no TRL (pip downloads it)")
    p = modes.add_parser("replay", help="TRL's loss and update on hybridflow's recorded batches")
    p.add_argument("--seed", type=int, default=0, help="the model folder's and the run's seed")
    p.add_argument("--steps", type=int, default=60, help="steps recorded")
    p.add_argument("--prompts", type=int, default=50, help="prompts per step")
    p.add_argument("--group", type=int, default=16, help="responses per prompt")
    p.add_argument("--lr", type=float, default=2e-3, help="AdamW learning rate")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--out", default="runs/bench_vs_trl", help="output folder")
    p.add_argument("--trl-venv", default=str(TRL_VENV), help="the side environment with TRL")
    p.add_argument("--make-trl-venv", action="store_true", help="make --trl-venv if it has no TRL (pip downloads it)")
    args = parser.parse_args(argv)
    if args.mode is None:  # the default form: how to use it, and whether TRL's side can run
        parser.print_usage()
        ready = (TRL_VENV / "bin" / "python").exists()
        raise SystemExit("choose a mode: learn, speed or replay (--help says what each does). "
                         + (f"TRL's side environment: {TRL_VENV}" if ready else missing_trl(TRL_VENV)))
    return {"learn": learn, "speed": speed, "replay": replay}[args.mode](args)


if __name__ == "__main__":
    main()
