"""Measure a run's models on this machine with the engines that will run them, and calibrate a cluster to them.

The compiler's side of calibration is pure: the :class:`~hybridflow.compiler.profiling.Profile` record, the fit of
the cost model's factors (:func:`~hybridflow.compiler.calibrate.calibrated_cluster`) and the cache's layout
(:func:`~hybridflow.compiler.calibrate.profile_key`, :func:`~hybridflow.compiler.calibrate.load_level`). Measuring
runs the runtime's engines, so it lives here:

- :func:`profile_model` builds the model from its ``config.json`` with random weights (weights do not change
  speed), then times, at each of a few batch sizes ``b`` of ``prompt_len``-token prompts:

  - ``forward_s``: :meth:`TrainEngine.compute_log_probs` over ``b`` sequences of ``prompt_len + response_len``
    tokens (one micro-batch);
  - ``train_s``: one :meth:`TrainEngine.update` (PPO clip + KL loss, one epoch, one mini-batch, one micro-batch:
    forward, backward, clipping, AdamW step);
  - ``prefill_s`` / ``generate_s``: :meth:`HFRolloutEngine.generate` of one and of ``response_len`` tokens per
    prompt (``n = 1``, EOS not stopping);
  - ``controller_s``: one GAE call on ``(b, response_len)`` tensors, the kind of math the controller's compute
    nodes run;

  and once ``train_split_s``: the update of the largest batch in ``split_micro_batches`` micro-batches. Each
  figure is the median of ``repeats`` runs after one warm-up run; the runs go round-robin over all the figures,
  so that a burst of other work on a shared machine spoils one run of several figures rather than every run of
  one.
- :func:`cached_profile` reads a profile from the cache or measures and stores it, per load level;
- :func:`run_profiles` profiles every model folder of a run (cached), :func:`calibrate` fits the cluster to them.
"""
from __future__ import annotations

import logging
import os
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from ..compiler.calibrate import cache_dir, calibrated_cluster, load_level, profile_key
from ..compiler.cluster import ClusterSpec
from ..compiler.cost import CostOptions
from ..compiler.models import ModelSpec
from ..compiler.profiling import Profile, host_description, load_model_config
from ..errors import ConfigError

log = logging.getLogger("hybridflow.compiler")

__all__ = ["profile_model", "cached_profile", "run_profiles", "calibrate"]


def _median_times(calls: Mapping[Any, Callable[[], Any]], repeats: int, sync: Callable[[], None]) -> dict[Any, float]:
    """Median wall seconds of each call over ``repeats`` round-robin passes, after one warm-up pass."""
    times: dict[Any, list[float]] = {key: [] for key in calls}
    for attempt in range(repeats + 1):
        for key, call in calls.items():
            start = time.perf_counter()
            call()
            sync()
            if attempt:
                times[key].append(time.perf_counter() - start)
    return {key: statistics.median(found) for key, found in times.items()}


def _build(config: dict[str, Any], device: str):
    """The causal LM of ``config`` with seeded random weights, on ``device``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    values = dict(config)
    model_type = values.pop("model_type", None)
    if model_type is None:
        raise ConfigError("profile: the model config has no model_type; give a transformers config.json")
    hf_config = AutoConfig.for_model(model_type, **values)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(hf_config).to(device), hf_config


def _tokenizer(source: str):
    """The folder's tokenizer when it has one (the rollout engine then detokenises, as in training), else None."""
    folder = Path(source)
    if not (folder / "tokenizer.json").is_file() and not (folder / "tokenizer_config.json").is_file():
        return None
    from ..data import load_tokenizer

    return load_tokenizer(folder)


def profile_model(model_dir_or_config: str | os.PathLike | Mapping[str, Any], device: str = "cpu",
                  threads: int | None = None, batch_sizes: tuple[int, ...] = (16, 128, 512), *,
                  prompt_len: int = 8, response_len: int = 4, repeats: int = 3,
                  split_micro_batches: int = 4) -> Profile:
    """Measure the model of ``model_dir_or_config`` on ``device`` (module docstring).

    ``threads``: torch threads while measuring (restored after); None keeps the current number.
    Raises ConfigError for a folder without config.json or a config transformers cannot build.
    """
    import torch
    from hybridflow_ops import get_op

    from ..batch import Batch
    from .engines import HFRolloutEngine, SamplingParams, TrainEngine, TrainEngineConfig

    if response_len < 2 or not batch_sizes or min(batch_sizes) < 1:
        raise ConfigError(f"profile: needs response_len >= 2 and batch sizes >= 1, got {response_len} and {batch_sizes}")
    batch_sizes = tuple(sorted(set(batch_sizes)))
    started = time.perf_counter()
    config, source = load_model_config(model_dir_or_config)
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    sync = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)
    try:
        module, hf_config = _build(config, device)
        vocab = hf_config.vocab_size
        tokenizer = _tokenizer(source) if source != "config" else None
        rollout = HFRolloutEngine(module, tokenizer=tokenizer, device=device)
        losses = [("ppo_clip", 1.0, {}), ("kl_loss", 0.1, {"kl_type": "low_var_kl"})]
        generator = torch.Generator().manual_seed(0)
        gae = get_op("gae").fn
        calls: dict[tuple[str, int], Callable[[], Any]] = {}
        for b in batch_sizes:
            prompt = torch.randint(min(4, vocab - 1), vocab, (b, prompt_len), generator=generator)
            response = torch.randint(min(4, vocab - 1), vocab, (b, response_len), generator=generator)
            ones = torch.ones(b, response_len)
            batch = {"prompt_ids": prompt, "prompt_mask": torch.ones(b, prompt_len), "response_ids": response,
                     "response_mask": ones, "old_log_probs": -ones, "ref_log_probs": -ones,
                     "advantages": torch.randn(b, response_len, generator=generator)}
            engine = TrainEngine(module, TrainEngineConfig(lr=1e-6), device=device)
            prompts = Batch({"prompt_ids": prompt, "prompt_mask": batch["prompt_mask"]})
            first = SamplingParams(n=1, max_new_tokens=1, temperature=1.0, stop_at_eos=False)
            every = SamplingParams(n=1, max_new_tokens=response_len, temperature=1.0, stop_at_eos=False)
            calls[("forward", b)] = lambda e=engine, t=batch: e.compute_log_probs(t)
            calls[("train", b)] = lambda e=engine, t=batch: e.update(t, losses)
            calls[("prefill", b)] = lambda p=prompts: rollout.generate(p, first)
            calls[("generate", b)] = lambda p=prompts: rollout.generate(p, every)
            calls[("controller", b)] = lambda o=ones: gae(-o, o, o)
        split = TrainEngine(module, TrainEngineConfig(lr=1e-6, micro_batch_size=max(1, batch_sizes[-1] // split_micro_batches)),
                            device=device)
        calls[("split", batch_sizes[-1])] = lambda: split.update(batch, losses)
        times = _median_times(calls, repeats, sync)
        used_threads = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    return Profile(
        model=ModelSpec.from_config(config, name=Path(source).name if source != "config" else None),
        source=source, device=str(device), threads=used_threads, torch_version=torch.__version__, host=host_description(),
        prompt_len=prompt_len, response_len=response_len, batch_sizes=tuple(batch_sizes),
        forward_s=_per_size(times, "forward", batch_sizes), train_s=_per_size(times, "train", batch_sizes),
        split_micro_batches=split_micro_batches, train_split_s=times[("split", batch_sizes[-1])],
        prefill_s=_per_size(times, "prefill", batch_sizes), generate_s=_per_size(times, "generate", batch_sizes),
        controller_s=_per_size(times, "controller", batch_sizes), seconds=time.perf_counter() - started)


def _per_size(times: Mapping[tuple[str, int], float], kind: str, batch_sizes: tuple[int, ...]) -> tuple[float, ...]:
    return tuple(times[(kind, b)] for b in batch_sizes)


def cached_profile(model: str | os.PathLike | Mapping, device: str = "cpu", threads: int | None = None, *,
                   cache: bool = True, busy: float | None = None, **settings) -> tuple[Profile, bool]:
    """(profile, whether it came from the cache) of ``model``: read from :func:`cache_dir` or measured and stored.

    ``busy``: cores other processes keep busy now (default: measured over 0.2 s); the profile of its
    :func:`load_level` is used. A new profile records the larger of that and the load measured while
    profiling (a neighbour that started meanwhile counts), and is stored under that load's level.
    ``settings`` go to :func:`profile_model` (batch_sizes, prompt_len, ...) and into the key.
    """
    import torch

    from .threads import OtherLoad, busy_cores

    config, source = load_model_config(model)
    used_threads = threads if threads is not None else torch.get_num_threads()
    key = profile_key(config, device, used_threads, **settings)
    busy = busy_cores() if busy is None else busy
    file = cache_dir() / f"{key}-load{load_level(busy)}.json"
    if cache and file.is_file():
        try:
            stored = Profile.from_json(file.read_text(encoding="utf-8"))
        except ValueError:
            pass  # a stale or broken entry: measure again and overwrite it
        else:  # the cache is keyed by the model's config: it is this model's profile, whichever folder measured it
            return stored.model_copy(update={"source": source}), True
    meter = OtherLoad()
    profile = profile_model(model, device=device, threads=used_threads, **settings)
    during = meter.cores()
    measured_under = max(busy, during or 0.0)
    if load_level(measured_under) != load_level(busy):
        log.info("calibrate: %.1f cores were busy elsewhere before profiling %s and %.1f while it ran: the profile "
                 "is kept as one of the higher load", busy, profile.source, during)
    profile = profile.model_copy(update={"busy_cores": measured_under})
    if cache:
        file = cache_dir() / f"{key}-load{load_level(measured_under)}.json"
        file.parent.mkdir(parents=True, exist_ok=True)
        staging = file.with_suffix(f".{os.getpid()}.tmp")
        staging.write_text(profile.to_json(), encoding="utf-8")
        staging.replace(file)
    return profile, False


def run_profiles(models: Mapping[str, str | os.PathLike | None], device: str = "cpu", threads: int | None = None,
                 cache: bool = True) -> list[tuple[Profile, bool]]:
    """(profile, whether it came from the cache) of each distinct model folder of a run: role -> folder (None or
    ``"rule"``: no model). ConfigError for a role whose model is not a folder with a config.json, or no folder."""
    folders = []
    for role, model in models.items():
        if model is None or str(model) == "rule":
            continue
        path = Path(model).resolve()
        if not (path / "config.json").is_file():
            raise ConfigError(f"calibrate: the model of role {role!r}, {str(model)!r}, is not a folder with a config.json")
        if path not in folders:
            folders.append(path)
    if not folders:
        raise ConfigError(f"calibrate: no role of {sorted(models)} has a model folder to measure")
    return [cached_profile(folder, device, threads, cache=cache) for folder in folders]


def calibrate(cluster: ClusterSpec | str, models: Mapping[str, str | os.PathLike | None], device: str = "cpu",
              threads: int | None = None, cache: bool = True, options: CostOptions | None = None) -> ClusterSpec:
    """``cluster`` calibrated to the models of a run: role -> model folder (None or ``"rule"``: no model).

    Each distinct folder is profiled once (or read from the cache, :func:`run_profiles`); the
    factors are fitted to all profiles together (:func:`calibrated_cluster`).
    """
    cluster = ClusterSpec.parse(cluster) if isinstance(cluster, str) else cluster
    profiles = [profile for profile, _ in run_profiles(models, device, threads, cache)]
    return calibrated_cluster(cluster, profiles, options)
