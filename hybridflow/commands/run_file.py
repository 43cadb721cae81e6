"""A run file (``CONFIG.yaml [key=value ...]``, as ``hybridflow run`` takes it) as the commands that plan with it
see it: its config and the run spec ``hybridflow run`` would derive (:func:`~hybridflow.trainer.run_spec.derive`).

``compile``, ``simulate`` and ``profile`` take a run file in place of an algorithm or a model, and go through
:func:`run_file_spec`, so what they compile, simulate or measure is what the run would.
"""
from __future__ import annotations

import argparse
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping, Sequence

from ..errors import ConfigError

__all__ = ["is_run_file", "refuse_flags", "RunFile", "run_file_spec"]


def is_run_file(source: str) -> bool:
    """Whether a command's positional argument names a YAML run file (rather than an algorithm)."""
    return Path(source).suffix.lower() in (".yaml", ".yml")


def refuse_flags(args: argparse.Namespace, flags: Mapping[str, str]) -> None:
    """ConfigError naming the flags (``flags``: argument name -> what to say) given with a run file, which sets them."""
    given = [flag for name, flag in flags.items() if getattr(args, name, None)]
    if given:
        raise ConfigError(f"{args.algorithm} is a run file: its config sets what {', '.join(given)} would; give "
                          "those as key=value overrides after the file, as for hybridflow run")


@dataclass(frozen=True)
class RunFile:
    """A run file's config and run spec; ``preset`` is the cluster preset it was derived for (None: this machine)."""

    config: object
    spec: object
    preset: object = None


def _config(source: str, overrides: Sequence[str], imports: Sequence[str], cluster: str | None, cpu_slots: int | None):
    """(algorithm, config, cluster) of the run file with the overrides and the cluster's executor and cpu_slots."""
    from ..trainer.config_files import load_run_config

    algorithm, config = load_run_config(source, overrides, imports)
    if config.plan:
        raise ConfigError(f"plan={config.plan!r} runs a plan compiled earlier; drop it to plan with the config")
    cluster = cluster or config.executor
    update = {}
    if cluster in ("local", "ray"):
        update["executor"] = cluster
    elif cpu_slots is not None:
        raise ConfigError("--cpu-slots applies to --cluster local or ray")
    else:
        update["calibrate"] = False  # a preset is not this machine: its datasheet figures
    if cpu_slots is not None:
        update["cpu_slots"] = cpu_slots
    return algorithm, config.model_copy(update=update), cluster


def _preset_machine(cluster: str):
    """(Machine, ClusterSpec) of a preset: its devices, of the kind a run there would have."""
    from ..compiler.cluster import ClusterSpec
    from ..compiler.machine import Machine

    spec = ClusterSpec.parse(cluster)
    kind = "cpu" if spec.name.startswith("cpu") else "cuda"
    return Machine(kind, spec.devices_per_node, nodes=spec.nodes, gpu_name=spec.name), spec


def run_file_spec(source: str, overrides: Sequence[str] = (), imports: Sequence[str] = (), *,
                  cluster: str | None = None, cpu_slots: int | None = None) -> RunFile:
    """The run spec ``hybridflow run source overrides`` would derive: for this machine (``cluster`` ``local``, or
    ``ray``: the Ray cluster; default the config's executor), or for a cluster preset ``PRESET[:NODES]`` (datasheet
    figures). The graph is the trainer's (the config's attributes), checked as a run checks it; the built-in model,
    when the config names none, is made in a scratch folder (or copied from the cache), never in ``output_dir``."""
    from ..trainer import Trainer
    from ..trainer.planning import run_machine
    from ..trainer.run_spec import derive, set_process_threads
    from ..trainer.setup import check_batch_sizes, check_devices, check_trainable, run_inputs

    algorithm, config, cluster = _config(source, overrides, imports, cluster, cpu_slots)
    graph = Trainer(config, algorithm=algorithm).build_graph()
    check_trainable(graph)
    check_batch_sizes(graph, config)
    preset = None
    if cluster in ("local", "ray"):
        check_devices(config.device_map)
        machine = run_machine(config)
        set_process_threads(config, machine)
    else:
        machine, preset = _preset_machine(cluster)
    with tempfile.TemporaryDirectory(prefix="hybridflow-plan-") as scratch:
        spec = derive(config, graph, machine, run_inputs(config, Path(scratch)))
    if preset is not None:
        spec = replace(spec, cluster=preset)
    return RunFile(config, spec, preset)
