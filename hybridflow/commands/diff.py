"""``hybridflow diff RUN_A RUN_B``: how two runs differ, and where their values first part.

Sections, each "same" or its differences (:mod:`hybridflow.trainer.run_diff`):

* **config** — the algorithm and every config field (``config.json``; ``output_dir`` left out);
* **graph** — nodes, their attributes and inputs, the roles (from each ``plan.json``);
* **plan** — placement, layouts, weight-sync method, staleness, the cluster it was priced for, predicted step, op order;
* **environment** — python, package versions, torch threads, devices (``environment.json``);
* **values** — with both runs' ``hashes.jsonl`` (``record_hashes=true``): the first step and edge whose digests
  differ, e.g. ``step 3, `actor.logprob.logprobs` (pool actor)``, or that they are bit-identical.

Exit status 0 either way (a difference is a finding, not an error); a folder that is no run is an error.
Keep module-level imports light: this module is imported by ``hybridflow --help``.
"""
from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_arguments", "run", "diff_lines"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_a", metavar="RUN_A", help="a run's output folder")
    parser.add_argument("run_b", metavar="RUN_B", help="another run's output folder")
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                        help="import MODULE first (one that registers the custom ops the runs' graphs use); repeatable")


def _section(title: str, rows, absent: str | None = None) -> list[str]:
    if absent:
        return [f"{title}: {absent}"]
    if not rows:
        return [f"{title}: same"]
    return [f"{title}: {len(rows)} difference(s)"] + [f"  {row}" for row in rows]


def _values(run_a: Path, run_b: Path) -> list[str]:
    from ..trainer.run_diff import first_divergence
    from ..trainer.run_folder import read_hashes

    missing = [str(run / "hashes.jsonl") for run in (run_a, run_b) if not (run / "hashes.jsonl").is_file()]
    if missing:
        return [f"values: not compared ({', '.join(missing)} missing: run with record_hashes=true to record them)"]
    a, b = read_hashes(run_a), read_hashes(run_b)
    steps_a, steps_b = sorted({r.step for r in a}), sorted({r.step for r in b})
    common = sorted(set(steps_a) & set(steps_b))
    divergence = first_divergence(a, b)
    if divergence is not None:
        return [f"values: first differ at {divergence}"]
    if not common:
        return ["values: the runs recorded no step in common"]
    lines = [f"values: bit-identical over the {len(common)} step(s) both recorded ({common[0]}..{common[-1]})"]
    if steps_a != steps_b:
        lines.append(f"  (A recorded steps {steps_a[0]}..{steps_a[-1]}, B {steps_b[0]}..{steps_b[-1]})")
    return lines


def diff_lines(run_a: Path, run_b: Path) -> list[str]:
    """The report (module docstring)."""
    from ..errors import RunFolderError
    from ..trainer.run_diff import config_differences, environment_differences, graph_differences, plan_differences
    from ..trainer.run_folder import read_environment, read_run_config, read_run_plan

    plan_a, plan_b = read_run_plan(run_a), read_run_plan(run_b)
    lines = [f"A: {run_a}", f"B: {run_b}"]
    try:
        lines += _section("config", config_differences(read_run_config(run_a), read_run_config(run_b)))
    except RunFolderError as err:
        lines += _section("config", None, f"not compared ({err})")
    lines += _section("graph", graph_differences(plan_a, plan_b))
    lines += _section("plan", plan_differences(plan_a, plan_b))
    env_a, env_b = read_environment(run_a), read_environment(run_b)
    absent = None if env_a and env_b else "not compared (a run without environment.json: it predates them)"
    lines += _section("environment", environment_differences(env_a, env_b) if not absent else None, absent)
    return lines + _values(run_a, run_b)


def run(args: argparse.Namespace) -> int:
    from ..algorithms.resolve import import_modules

    import_modules(args.imports, "--import")
    print("\n".join(diff_lines(Path(args.run_a), Path(args.run_b))))
    return 0
