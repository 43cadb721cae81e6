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
  one. With ``depths`` (the quick profile, :func:`quick_settings`) it measures copies of the model that many
  layers deep instead, each built once with one train engine for all batch sizes, and extrapolates every model
  figure to the model's depth (:func:`extrapolate`); all of it is freed before it returns, so that the run's own
  models are the largest thing the process holds.
- :func:`cached_profile` reads a profile from the cache or measures and stores it, per load level; a level
  without one borrows the nearest level's, which the run's drift check then keeps for it or drops
  (:func:`settle_profile`, :mod:`hybridflow.trainer.calibration_check`);
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

__all__ = ["profile_model", "cached_profile", "run_profiles", "calibrate", "quick_settings", "extrapolate",
           "extrapolate_figures", "profile_settings", "settle_profile", "with_layers"]


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


QUICK_DEPTHS = (1, 2)
"""The depths the quick profile measures a deeper model at (:func:`quick_settings`, :func:`extrapolate`)."""

QUICK_BUDGET = 8e8
"""Matmul parameters x tokens of the quick profile's largest batch at its deepest measured depth: 512 sequences of
12 tokens of the ~0.13M-parameter tiny model, 32 of two layers of the ~8M model. It keeps the figures in the tens of
milliseconds and their memory below a run's (a batch of 512 on the whole ~8M model peaked at 2.4 GB)."""

FULL_SETTINGS: dict[str, Any] = {"batch_sizes": (16, 128, 512), "repeats": 3}
"""The full profile (``calibrate_quick=false``): every layer, batch sizes up to 512 (about a minute on the ~8M model)."""


def with_layers(config: Mapping[str, Any], layers: int) -> dict[str, Any]:
    """``config`` with ``layers`` transformer blocks (``num_hidden_layers`` and a per-layer ``layer_types`` list cut)."""
    shallower = dict(config)
    shallower["num_hidden_layers"] = layers
    if isinstance(shallower.get("layer_types"), list):
        shallower["layer_types"] = shallower["layer_types"][:layers]
    return shallower


def quick_settings(config: Mapping[str, Any], prompt_len: int = 8, response_len: int = 4) -> dict[str, Any]:
    """The quick profile's settings for the model of ``config``: ``depths`` (:data:`QUICK_DEPTHS` when the model is
    deeper than they are, else none: the whole model) and ``batch_sizes`` b/16, b/4, b, with b the largest power of
    two (4 to 512) whose batch stays within :data:`QUICK_BUDGET` at the deepest depth measured."""
    layers = int(config.get("num_hidden_layers") or 1)
    depths = QUICK_DEPTHS if layers > QUICK_DEPTHS[-1] else None
    measured = ModelSpec.from_config(with_layers(config, depths[-1]) if depths else dict(config))
    fits = QUICK_BUDGET / max(1, measured.flop_params * (prompt_len + response_len))
    largest = 4
    while largest * 2 <= min(512, fits):
        largest *= 2
    return {"batch_sizes": tuple(sorted({max(1, largest // 16), max(1, largest // 4), largest})), "depths": depths}


def extrapolate(shallow_s: float, deep_s: float, depths: tuple[int, int], layers: int) -> float:
    """The time of a ``layers``-deep model from the times of copies ``depths[0]`` and ``depths[1]`` layers deep:
    the embedding, head, sampling and fixed costs are in both, each layer adds the same time (a block's matmuls,
    attention and per-module launches), so ``t(L) = t(d0) + (L - d0) * (t(d1) - t(d0)) / (d1 - d0)``. A per-layer
    time measured below zero (noise between two near-equal figures) counts as zero: a layer does not save time."""
    shallow, deep = depths
    per_layer = max(0.0, deep_s - shallow_s) / (deep - shallow)
    return shallow_s + (layers - shallow) * per_layer


def extrapolate_figures(measured: Mapping[tuple[int | None, str, int], float], depths: tuple[int, int] | None,
                        layers: int) -> dict[tuple[str, int], float]:
    """(figure, batch size) -> seconds of the ``layers``-deep model, from ``measured``: (depth, figure, batch size)
    -> seconds, as :func:`profile_model` times them. With ``depths`` every model figure is :func:`extrapolate`-d
    from the two copies' (the controller's GAE call, depth None, has no layers and is taken as measured);
    without, the whole model was measured (depth None) and the figures are taken as they are."""
    if not depths:
        return {(kind, b): t for (_, kind, b), t in measured.items()}
    times = {(kind, b): extrapolate(t, measured[(depths[1], kind, b)], depths, layers)
             for (depth, kind, b), t in measured.items() if depth == depths[0]}
    times.update({(kind, b): t for (depth, kind, b), t in measured.items() if depth is None})
    return times


def _figures(module, tokenizer, vocab: int, device: str, batch_sizes: tuple[int, ...], prompt_len: int,
             response_len: int, split_micro_batches: int, generator) -> dict[tuple[str, int], Callable[[], Any]]:
    """The calls :func:`profile_model` times on one model: (figure, batch size) -> call."""
    import torch

    from ..batch import Batch
    from .engines import HFRolloutEngine, SamplingParams, TrainEngine, TrainEngineConfig

    rollout = HFRolloutEngine(module, tokenizer=tokenizer, device=device)
    losses = [("ppo_clip", 1.0, {}), ("kl_loss", 0.1, {"kl_type": "low_var_kl"})]
    # one engine (one AdamW state) for every batch size: the model is built and its optimizer state held once
    engine = TrainEngine(module, TrainEngineConfig(lr=1e-6), device=device)
    calls: dict[tuple[str, int], Callable[[], Any]] = {}
    batch: dict[str, Any] = {}
    for b in batch_sizes:
        prompt = torch.randint(min(4, vocab - 1), vocab, (b, prompt_len), generator=generator)
        response = torch.randint(min(4, vocab - 1), vocab, (b, response_len), generator=generator)
        ones = torch.ones(b, response_len)
        batch = {"prompt_ids": prompt, "prompt_mask": torch.ones(b, prompt_len), "response_ids": response,
                 "response_mask": ones, "old_log_probs": -ones, "ref_log_probs": -ones,
                 "advantages": torch.randn(b, response_len, generator=generator)}
        prompts = Batch({"prompt_ids": prompt, "prompt_mask": batch["prompt_mask"]})
        first = SamplingParams(n=1, max_new_tokens=1, temperature=1.0, stop_at_eos=False)
        every = SamplingParams(n=1, max_new_tokens=response_len, temperature=1.0, stop_at_eos=False)
        calls[("forward", b)] = lambda e=engine, t=batch: e.compute_log_probs(t)
        calls[("train", b)] = lambda e=engine, t=batch: e.update(t, losses)
        calls[("prefill", b)] = lambda p=prompts, s=first: rollout.generate(p, s)
        calls[("generate", b)] = lambda p=prompts, s=every: rollout.generate(p, s)
    split = TrainEngine(module, TrainEngineConfig(lr=1e-6, micro_batch_size=max(1, batch_sizes[-1] // split_micro_batches)),
                        device=device)
    calls[("split", batch_sizes[-1])] = lambda t=batch: split.update(t, losses)
    return calls


def profile_model(model_dir_or_config: str | os.PathLike | Mapping[str, Any], device: str = "cpu",
                  threads: int | None = None, batch_sizes: tuple[int, ...] = (16, 128, 512), *,
                  prompt_len: int = 8, response_len: int = 4, repeats: int = 3,
                  split_micro_batches: int = 4, depths: tuple[int, int] | None = None) -> Profile:
    """Measure the model of ``model_dir_or_config`` on ``device`` (module docstring).

    ``threads``: torch threads while measuring (restored after); None keeps the current number.
    ``depths``: measure copies of the model this many layers deep (fewer than the model's) instead of the whole
    model, and :func:`extrapolate` every model figure to its depth; None (or a model not deeper): the whole model.
    Raises ConfigError for a folder without config.json or a config transformers cannot build.
    """
    import gc

    import torch
    from hybridflow_ops import get_op

    if response_len < 2 or not batch_sizes or min(batch_sizes) < 1:
        raise ConfigError(f"profile: needs response_len >= 2 and batch sizes >= 1, got {response_len} and {batch_sizes}")
    batch_sizes = tuple(sorted(set(batch_sizes)))
    started = time.perf_counter()
    config, source = load_model_config(model_dir_or_config)
    layers = int(config.get("num_hidden_layers") or 1)
    if depths is not None:
        depths = tuple(sorted(set(int(d) for d in depths)))
        if len(depths) != 2 or depths[0] < 1:
            raise ConfigError(f"profile: depths must be two different layer counts >= 1, got {depths}")
        if depths[-1] >= layers:
            depths = None  # the model is no deeper than the copies would be: measure it whole
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    sync = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)
    try:
        tokenizer = _tokenizer(source) if source != "config" else None
        generator = torch.Generator().manual_seed(0)
        calls: dict[tuple[Any, str, int], Callable[[], Any]] = {}
        for depth in depths or (None,):
            module, hf_config = _build(with_layers(config, depth) if depth else config, device)
            for (kind, b), call in _figures(module, tokenizer, hf_config.vocab_size, device, batch_sizes, prompt_len,
                                            response_len, split_micro_batches, generator).items():
                calls[(depth, kind, b)] = call
            del module
        gae = get_op("gae").fn
        for b in batch_sizes:
            ones = torch.ones(b, response_len)
            calls[(None, "controller", b)] = lambda o=ones: gae(-o, o, o)
        measured = _median_times(calls, repeats, sync)
        used_threads = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
        calls = {}  # the models, engines and optimizer states go before the run builds its own
        gc.collect()
    times = extrapolate_figures(measured, depths, layers)
    return Profile(
        model=ModelSpec.from_config(config, name=Path(source).name if source != "config" else None),
        source=source, device=str(device), threads=used_threads, torch_version=torch.__version__, host=host_description(),
        prompt_len=prompt_len, response_len=response_len, batch_sizes=tuple(batch_sizes),
        forward_s=_per_size(times, "forward", batch_sizes), train_s=_per_size(times, "train", batch_sizes),
        split_micro_batches=split_micro_batches, train_split_s=times[("split", batch_sizes[-1])],
        prefill_s=_per_size(times, "prefill", batch_sizes), generate_s=_per_size(times, "generate", batch_sizes),
        controller_s=_per_size(times, "controller", batch_sizes), seconds=time.perf_counter() - started,
        measured_layers=tuple(depths or ()))


def _per_size(times: Mapping[tuple[str, int], float], kind: str, batch_sizes: tuple[int, ...]) -> tuple[float, ...]:
    return tuple(times[(kind, b)] for b in batch_sizes)


def profile_settings(config: Mapping[str, Any], quick: bool = True, **settings) -> dict[str, Any]:
    """What :func:`profile_model` is asked for: the quick profile's (:func:`quick_settings`) or the full one's
    (:data:`FULL_SETTINGS`), with ``settings`` given explicitly winning."""
    return {**(quick_settings(config) if quick else FULL_SETTINGS), **settings}


def _level_file(key: str, level: int) -> Path:
    return cache_dir() / f"{key}-load{level}.json"


def _drifted_file(key: str, level: int) -> Path:
    """The mark that a profile of another level drifted at ``level``: that level measures its own again."""
    return cache_dir() / f"{key}-load{level}.drifted"


def _write(file: Path, text: str) -> None:
    file.parent.mkdir(parents=True, exist_ok=True)
    staging = file.with_suffix(f".{os.getpid()}.tmp")
    staging.write_text(text, encoding="utf-8")
    staging.replace(file)


def _read(file: Path) -> Profile | None:
    try:
        return Profile.from_json(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # gone, stale or broken: measure again and overwrite it


def _lookup(key: str, level: int) -> Profile | None:
    """The cached profile for ``level``: its own, else (unless one drifted here) the nearest level's, marked as
    borrowed (``used_at_level``) for the first steps' drift check (:func:`settle_profile`)."""
    own = _read(_level_file(key, level))
    if own is not None:
        return own.model_copy(update={"cache_level": level, "used_at_level": None})
    if _drifted_file(key, level).exists():
        return None
    others = []
    for file in cache_dir().glob(f"{key}-load*.json"):
        found, stored_at = _read(file), file.stem.rpartition("-load")[2]
        if found is not None and stored_at.isdigit():
            others.append((abs(int(stored_at) - level), int(stored_at), found))
    if not others:
        return None
    _, stored_at, found = min(others, key=lambda item: item[:2])
    return found.model_copy(update={"cache_level": stored_at, "used_at_level": level})


def cached_profile(model: str | os.PathLike | Mapping, device: str = "cpu", threads: int | None = None, *,
                   cache: bool = True, busy: float | None = None, quick: bool = True, **settings) -> tuple[Profile, bool]:
    """(profile, whether it came from the cache) of ``model``: read from :func:`cache_dir` or measured and stored.

    ``busy``: cores other processes keep busy now (default: measured over 0.2 s). The profile of its
    :func:`load_level` is used; without one, the nearest level's, marked ``used_at_level`` so that the run's drift
    check confirms it for this level or has this level measured (:func:`settle_profile`); none at all: measured.
    A new profile records the larger of that and the load measured while profiling (a neighbour that started
    meanwhile counts), and is stored under that load's level.
    ``quick``: the quick profile's settings, else the full one's (:func:`profile_settings`); ``settings`` go to
    :func:`profile_model` (batch_sizes, prompt_len, ...) and into the key.
    """
    import torch

    from .threads import OtherLoad, busy_cores

    config, source = load_model_config(model)
    settings = profile_settings(config, quick, **settings)
    used_threads = threads if threads is not None else torch.get_num_threads()
    key = profile_key(config, device, used_threads, **settings)
    busy = busy_cores() if busy is None else busy
    if cache:
        stored = _lookup(key, load_level(busy))
        if stored is not None:  # the cache is keyed by the model's config: it is this model's profile, whichever folder measured it
            if stored.used_at_level is not None:
                log.info("calibrate: no profile of %s at load level %d yet: the one measured at level %d is used, and "
                         "checked against the first steps", source, stored.used_at_level, stored.cache_level)
            return stored.model_copy(update={"source": source, "cache_key": key}), True
    marker = _drifted_file(key, load_level(busy))
    if cache and settings.get("depths") and marker.is_file() and marker.read_text(encoding="utf-8").startswith("whole"):
        log.info("calibrate: the extrapolated profile of %s drifted at this load level: measuring the whole model", source)
        settings = {**settings, "depths": None}  # stored under the quick key: this level's quick profile, measured whole
    meter = OtherLoad()
    profile = profile_model(model, device=device, threads=used_threads, **settings)
    during = meter.cores()
    measured_under = max(busy, during or 0.0)
    if load_level(measured_under) != load_level(busy):
        log.info("calibrate: %.1f cores were busy elsewhere before profiling %s and %.1f while it ran: the profile "
                 "is kept as one of the higher load", busy, profile.source, during)
    profile = profile.model_copy(update={"busy_cores": measured_under, "cache_key": key if cache else "",
                                         "cache_level": load_level(measured_under) if cache else None})
    if cache:
        _write(_level_file(key, load_level(measured_under)), profile.to_json())
        _drifted_file(key, load_level(measured_under)).unlink(missing_ok=True)
    return profile, False


def settle_profile(profile: Profile, drifted: bool) -> str | None:
    """After the run's drift check: what becomes of its cached ``profile`` (a line saying so, None: nothing).

    Held (``drifted`` False): a profile borrowed from another load level is stored for the run's level too, which
    then reads it without measuring. Drifted: a borrowed profile's level is marked to measure its own, a profile of
    the run's own level is dropped; the next start measures this machine again either way, the whole model when the
    dropped profile was extrapolated from shallow copies (:func:`extrapolate` did not hold on this machine).
    """
    if not profile.cache_key or profile.cache_level is None:
        return None
    key, measured_at = profile.cache_key, profile.cache_level
    if profile.used_at_level is not None:
        if drifted:
            _write(_drifted_file(key, profile.used_at_level), f"level {measured_at}'s profile drifted here\n")
            return (f"the profile of load level {measured_at} does not hold at level {profile.used_at_level}: "
                    "the next start measures this level")
        kept = profile.model_copy(update={"used_at_level": None, "cache_level": profile.used_at_level})
        _write(_level_file(key, profile.used_at_level), kept.to_json())
        return f"the profile of load level {measured_at} holds at level {profile.used_at_level}: kept for it"
    if drifted:
        _level_file(key, measured_at).unlink(missing_ok=True)
        if profile.model.layers > QUICK_DEPTHS[-1]:  # a model the quick profile extrapolates: measured whole next
            _write(_drifted_file(key, measured_at), f"whole: level {measured_at}'s profile drifted\n")
            how = f"extrapolated from {profile.measured_layers} layers" if profile.measured_layers else "the whole model"
            return (f"the profile of load level {measured_at} ({how}) no longer holds: dropped, the next start "
                    "measures the whole model")
        _write(_drifted_file(key, measured_at), f"level {measured_at}'s own profile drifted\n")
        return f"the profile of load level {measured_at} no longer holds: dropped, the next start measures again"
    return None


def run_profiles(models: Mapping[str, str | os.PathLike | None], device: str = "cpu", threads: int | None = None,
                 cache: bool = True, quick: bool = True) -> list[tuple[Profile, bool]]:
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
    return [cached_profile(folder, device, threads, cache=cache, quick=quick) for folder in folders]


def calibrate(cluster: ClusterSpec | str, models: Mapping[str, str | os.PathLike | None], device: str = "cpu",
              threads: int | None = None, cache: bool = True, options: CostOptions | None = None) -> ClusterSpec:
    """``cluster`` calibrated to the models of a run: role -> model folder (None or ``"rule"``: no model).

    Each distinct folder is profiled once (or read from the cache, :func:`run_profiles`); the
    factors are fitted to all profiles together (:func:`calibrated_cluster`).
    """
    cluster = ClusterSpec.parse(cluster) if isinstance(cluster, str) else cluster
    profiles = [profile for profile, _ in run_profiles(models, device, threads, cache)]
    return calibrated_cluster(cluster, profiles, options)
