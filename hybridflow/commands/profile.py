"""``hybridflow profile CONFIG.yaml [key=value ...]`` or ``hybridflow profile --model PATH [--device cpu] [--threads N]
[--cluster cpu-local] [--no-cache]``.

With a run file: measures the run's models as the run's calibration does (the same folders, device and threads,
through the run spec, :func:`~hybridflow.trainer.run_spec.derive`; cached), prints the figures and the cluster
fields the run's cost model gets from them. With ``--model``: measures one model with the trainer's engines (or
reads the cached measurement), prints the figures per batch size, and the cluster fields the cost model gets from
them (:mod:`hybridflow.compiler.calibrate`).

Keep module-level imports light: this module is imported by ``hybridflow --help``.
"""
from __future__ import annotations

import argparse

from ..errors import ConfigError

__all__ = ["add_arguments", "run", "profile_lines", "measured_lines", "fitted_lines"]

_MODEL_FLAGS = {"model": "--model", "device": "--device", "threads": "--threads (num_threads=...)",
                "cluster": "--cluster", "no_cache": "--no-cache"}
"""The single-model form's flags, which a run file sets (or which do not apply to it)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("algorithm", nargs="?", metavar="CONFIG.yaml",
                        help="a run file: measure its models as its run's calibration does (the run's folders, "
                             "device and threads)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="CONFIG.yaml: field overrides, as for run")
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                        help="CONFIG.yaml: import MODULE first (custom ops); repeatable")
    parser.add_argument("--model", metavar="PATH", help="a model folder with a config.json (weights are not read)")
    parser.add_argument("--device", default=None, help="torch device to measure on (cpu, cuda, cuda:N; default cpu)")
    parser.add_argument("--threads", type=int, default=None, metavar="N", help="torch threads while measuring (default: torch's)")
    parser.add_argument("--cluster", default=None, metavar="PRESET",
                        help="the cluster whose factors are fitted (default cpu-local)")
    parser.add_argument("--no-cache", action="store_true", help="measure again even when a cached profile exists (and do not store it)")


def measured_lines(profile, cached: bool) -> list[str]:
    """One model's measured figures per batch size."""
    from ..compiler.calibrate import cache_dir

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
    return lines


def fitted_lines(cluster) -> list[str]:
    """The cluster fields calibration fits."""
    from ..compiler.calibrate import FITTED_FIELDS

    lines = [f"fitted {cluster.name} (peak {cluster.peak_flops / 1e9:.0f} GFLOP/s):"]
    for name in FITTED_FIELDS:
        value = getattr(cluster, name)
        lines.append(f"  {name:<30} {value * 1e3:.4f} ms" if name.endswith("_s") else f"  {name:<30} {value:.4f}")
    return lines


def profile_lines(profile, cluster, cached: bool) -> list[str]:
    """The measured figures and the fitted fields, as printed by the command."""
    return measured_lines(profile, cached) + fitted_lines(cluster)


def _run_file(args: argparse.Namespace) -> int:
    from .run_file import refuse_flags, run_file_spec

    refuse_flags(args, _MODEL_FLAGS)
    spec = run_file_spec(args.algorithm, args.overrides, args.imports).spec
    if not spec.calibrated:
        raise ConfigError(f"{args.algorithm}: the run would not calibrate (calibrate=false, or a model that is not a "
                          "local folder, or GPUs this process does not see); it uses datasheet figures")
    for profile, cached in spec.profiles:
        print("\n".join(measured_lines(profile, cached)))
    print("\n".join(fitted_lines(spec.cluster)))
    return 0


def run(args: argparse.Namespace) -> int:
    from ..compiler.calibrate import calibrated_cluster
    from ..compiler.cluster import ClusterSpec
    from ..runtime.calibration import cached_profile

    if args.algorithm is not None:
        return _run_file(args)
    if args.overrides or args.model is None:
        raise ConfigError("give a run file (hybridflow profile CONFIG.yaml [key=value ...]) or a model folder "
                          "(hybridflow profile --model PATH)")
    profile, cached = cached_profile(args.model, args.device or "cpu", args.threads, cache=not args.no_cache)
    cluster = calibrated_cluster(ClusterSpec.parse(args.cluster or "cpu-local"), profile)
    print("\n".join(profile_lines(profile, cluster, cached)))
    return 0
