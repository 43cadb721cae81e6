"""Measure a model on a device with the engines the trainer runs: the raw figures of calibration.

:func:`profile_model` builds the model from its ``config.json`` with random
weights (weights do not change speed), then times, at each of a few batch
sizes ``b`` of ``prompt_len``-token prompts:

- ``forward_s``: :meth:`TrainEngine.compute_log_probs` over ``b`` sequences of
  ``prompt_len + response_len`` tokens (one micro-batch);
- ``train_s``: one :meth:`TrainEngine.update` (PPO clip + KL loss, one epoch,
  one mini-batch, one micro-batch: forward, backward, clipping, AdamW step);
- ``prefill_s`` / ``generate_s``: :meth:`HFRolloutEngine.generate` of one and of
  ``response_len`` tokens per prompt (``n = 1``, EOS not stopping);
- ``controller_s``: one GAE call on ``(b, response_len)`` tensors, the kind of
  math the controller's compute nodes run;

and once ``train_split_s``: the update of the largest batch in
``split_micro_batches`` micro-batches. Each figure is the median of
``repeats`` runs after one warm-up run; the runs go round-robin over all the
figures, so that a burst of other work on a shared machine spoils one run of
several figures rather than every run of one. :mod:`hybridflow.compiler.calibrate`
fits the cluster's factors to these figures and caches them.
"""
from __future__ import annotations

import json
import os
import platform
import socket
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from pydantic import BaseModel, ConfigDict, Field

from ..errors import ConfigError
from .models import ModelSpec

__all__ = ["Profile", "profile_model", "host_description", "load_model_config"]


class Profile(BaseModel):
    """Times of one model on one device and thread count, per batch size (seconds, medians)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: ModelSpec = Field(description="The model's shape, read from its config.json.")
    source: str = Field(description="The folder (or 'config') the model was built from.")
    device: str = Field(description="torch device the figures were measured on.")
    threads: int = Field(ge=1, description="torch.get_num_threads() while measuring.")
    torch_version: str = Field(description="torch.__version__.")
    host: str = Field(description="hostname and CPU model (see host_description).")
    prompt_len: int = Field(ge=1, description="Tokens per prompt.")
    response_len: int = Field(ge=2, description="Tokens per response (generation and the sequences of forward / train).")
    batch_sizes: tuple[int, ...] = Field(description="Sequences per call, one figure per size in each tuple below.")
    forward_s: tuple[float, ...] = Field(description="compute_log_probs, one micro-batch.")
    train_s: tuple[float, ...] = Field(description="One update: one optimizer step over one micro-batch.")
    split_micro_batches: int = Field(ge=2, description="Micro-batches of the split update.")
    train_split_s: float = Field(description="One update of the largest batch in split_micro_batches micro-batches.")
    prefill_s: tuple[float, ...] = Field(description="generate with max_new_tokens=1 (prefill and one sampling).")
    generate_s: tuple[float, ...] = Field(description="generate with max_new_tokens=response_len.")
    controller_s: tuple[float, ...] = Field(description="One GAE call on (b, response_len) tensors.")
    seconds: float = Field(0.0, description="Wall time the profiling took (not counting the cache).")
    busy_cores: float = Field(0.0, ge=0.0, description="Cores other processes kept busy just before measuring "
                              "or while it ran, the larger (hybridflow.runtime.threads): the load the figures were taken under.")

    @property
    def seq_len(self) -> int:
        """Tokens of the sequences of forward and train: prompt_len + response_len."""
        return self.prompt_len + self.response_len

    def to_json(self) -> str:
        return self.model_dump_json(indent=1)

    @classmethod
    def from_json(cls, text: str) -> "Profile":
        return cls.model_validate_json(text)


def host_description() -> str:
    """``hostname / CPU model`` (``model name`` of /proc/cpuinfo, else platform.processor())."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{socket.gethostname()} / {cpu}"


def load_model_config(model: str | os.PathLike | Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """(config.json as a dict, source name) of a model folder, a config.json path or a config dict."""
    if isinstance(model, Mapping):
        return dict(model), "config"
    path = Path(model)
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise ConfigError(f"profile: {str(model)!r} is neither a model folder with a config.json nor a config.json file")
    try:
        return json.loads(file.read_text(encoding="utf-8")), str(path)
    except json.JSONDecodeError as err:
        raise ConfigError(f"profile: {file} is not valid JSON ({err})") from None


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

    from ..runtime.batch import Batch
    from ..runtime.engines import HFRolloutEngine, SamplingParams, TrainEngine, TrainEngineConfig

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
