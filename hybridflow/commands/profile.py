"""``hybridflow profile --model PATH [--device cpu] [--threads N] [--cluster cpu-local] [--no-cache]``.

Measures the model with the trainer's engines (or reads the cached
measurement), prints the figures per batch size, and the cluster fields the
cost model gets from them (:mod:`hybridflow.compiler.calibrate`).

Keep module-level imports light: this module is imported by ``hybridflow --help``.
"""
from __future__ import annotations

import argparse

__all__ = ["add_arguments", "run", "profile_lines"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, metavar="PATH", help="a model folder with a config.json (weights are not read)")
    parser.add_argument("--device", default="cpu", help="torch device to measure on (cpu, cuda, cuda:N)")
    parser.add_argument("--threads", type=int, default=None, metavar="N", help="torch threads while measuring (default: torch's)")
    parser.add_argument("--cluster", default="cpu-local", metavar="PRESET", help="the cluster whose factors are fitted")
    parser.add_argument("--no-cache", action="store_true", help="measure again even when a cached profile exists (and do not store it)")


def profile_lines(profile, cluster, cached: bool) -> list[str]:
    """The measured figures and the fitted fields, as printed by the command."""
    from ..compiler.calibrate import FITTED_FIELDS, cache_dir

    m = profile.model
    where = f"cached in {cache_dir()}" if cached else f"measured in {profile.seconds:.1f} s"
    lines = [f"{profile.source}: {m.params:,} parameters ({m.layers} layers, hidden {m.hidden}) on {profile.device}, "
             f"{profile.threads} thread(s), torch {profile.torch_version}; {where}",
             f"  host {profile.host}, {profile.busy_cores:.1f} cores busy elsewhere; prompts of {profile.prompt_len} "
             f"tokens, responses of {profile.response_len}",
             f"  {'batch':>6} {'forward ms':>11} {'train ms':>9} {'prefill ms':>11} {'generate ms':>12}"]
    for i, b in enumerate(profile.batch_sizes):
        lines.append(f"  {b:>6} {1e3 * profile.forward_s[i]:>11.2f} {1e3 * profile.train_s[i]:>9.2f} "
                     f"{1e3 * profile.prefill_s[i]:>11.2f} {1e3 * profile.generate_s[i]:>12.2f}")
    lines.append(f"  train of {profile.batch_sizes[-1]} in {profile.split_micro_batches} micro-batches: "
                 f"{1e3 * profile.train_split_s:.2f} ms")
    lines.append(f"fitted {cluster.name} (peak {cluster.peak_flops / 1e9:.0f} GFLOP/s):")
    for name in FITTED_FIELDS:
        value = getattr(cluster, name)
        lines.append(f"  {name:<30} {value * 1e3:.4f} ms" if name.endswith("_s") else f"  {name:<30} {value:.4f}")
    return lines


def run(args: argparse.Namespace) -> int:
    from ..compiler.calibrate import calibrated_cluster
    from ..runtime.calibration import cached_profile
    from ..compiler.cluster import ClusterSpec

    profile, cached = cached_profile(args.model, args.device, args.threads, cache=not args.no_cache)
    cluster = calibrated_cluster(ClusterSpec.parse(args.cluster), profile)
    print("\n".join(profile_lines(profile, cluster, cached)))
    return 0
