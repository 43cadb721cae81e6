"""What a measurement of a model on a device holds: :class:`Profile`, the raw figures of calibration.

:func:`hybridflow.runtime.calibration.profile_model` measures them with the engines the trainer runs;
:mod:`hybridflow.compiler.calibrate` fits the cluster's factors to them. Here also the two facts a profile's
cache key needs without running anything: the host (:func:`host_description`) and the model's
``config.json`` (:func:`load_model_config`).
"""
from __future__ import annotations

import json
import os
import platform
import socket
from pathlib import Path
from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict, Field

from ..errors import ConfigError
from .models import ModelSpec

__all__ = ["Profile", "host_description", "load_model_config"]


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
    measured_layers: tuple[int, ...] = Field((), description="The depths of the copies of the model that were measured, "
                                             "each figure extrapolated linearly in the layer count to the model's own "
                                             "depth (hybridflow.runtime.calibration.extrapolate); empty: the whole model was measured.")
    cache_key: str = Field("", description="The calibration cache's key of this profile (without the load level); "
                           "empty for a profile that did not go through the cache.")
    cache_level: int | None = Field(None, description="The load level of the cache entry this profile was read from or "
                                    "stored under; None: not through the cache.")
    used_at_level: int | None = Field(None, description="Set on a profile read from the cache for a run at another load "
                                      "level than it was measured at: that run's level (the first steps' drift check "
                                      "confirms the profile for it or has it measured again).")

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
