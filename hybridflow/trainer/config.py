"""Typed trainer configuration: :class:`PPOConfig` and its relatives.

One flat pydantic model (the seed article writes ``PPOConfig(actor_model_name=...,
max_steps=..., batch_size=..., rollout_batch_size=...)``), validated once, with a
description on every field. Each trainer maps the fields it understands onto
its algorithm's graph attributes (:data:`GRAPH_ATTRS`); the rest configure the
engines, the data and the loop.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..errors import ConfigError

__all__ = ["PPOConfig", "GRAPH_ATTRS", "config_error"]


class PPOConfig(BaseModel):
    """Everything a training run needs; every algorithm's trainer takes this config."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # -- models ---------------------------------------------------------------
    actor_model_name: str | None = Field(None, description="Actor (policy) model: a local transformers folder or a hub name. None: a tiny model made in code for the built-in task.")
    critic_model_name: str | None = Field(None, description="Critic backbone (PPO); None: the actor's model.")
    ref_model_name: str | None = Field(None, description="Reference model for the KL term; None: the actor's initial model.")
    reward_model_name: str | None = Field(None, description="Sequence-classification reward model (path or hub name); a causal-LM checkpoint gets a new score head. None: the rule reward `reward_fn`.")
    reward_fn: str = Field("hybridflow_ops.rewards:default_compute_score", description="Rule reward `module:function` with the signature compute_score(data_source, solution_str, ground_truth, extra_info=None).")
    unfinished_score: float | None = Field(0.0, description="Score of a response that hit the length limit without EOS (None: score it like the others).")
    # -- data -----------------------------------------------------------------
    train_files: str | None = Field(None, description="Prompt dataset (.jsonl or .parquet with prompt, ground_truth, data_source). None: the built-in arithmetic task (all 100 prompts 'a+b=').")
    val_files: str | None = Field(None, description="Held-out prompts for validation; None: the training prompts.")
    apply_chat_template: bool = Field(False, description="Format prompts with the tokenizer's chat template.")
    max_prompt_length: int = Field(512, ge=1, description="Prompts longer than this are an error.")
    max_response_length: int = Field(256, ge=1, description="Maximum new tokens per response.")
    # -- batch sizes ----------------------------------------------------------
    rollout_batch_size: int = Field(8, ge=1, description="Prompts sampled per training step.")
    n_samples: int = Field(1, ge=1, description="Responses per prompt (a group, for GRPO/RLOO); GRPO's default is 8 when left at 1.")
    batch_size: int | None = Field(None, ge=1, description="Responses per optimizer step (mini-batch); None: all responses of the step.")
    micro_batch_size: int | None = Field(None, ge=1, description="Responses per forward/backward (gradient accumulation); None: the mini-batch.")
    ppo_epochs: int = Field(1, ge=1, description="Passes over the step's responses per update.")
    max_steps: int = Field(100, ge=1, description="Training steps (one rollout batch each).")
    # -- optimisation ---------------------------------------------------------
    actor_lr: float = Field(1e-6, ge=0.0, description="Actor learning rate (AdamW).")
    critic_lr: float = Field(1e-5, ge=0.0, description="Critic learning rate (AdamW).")
    warmup_steps: int = Field(0, ge=0, description="Linear learning-rate warm-up, in steps.")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay.")
    max_grad_norm: float | None = Field(1.0, gt=0.0, description="Gradient clipping norm; None: no clipping.")
    # -- algorithm ------------------------------------------------------------
    clip_ratio: float = Field(0.2, gt=0.0, description="PPO clip range epsilon (both sides).")
    value_clip: float = Field(0.2, gt=0.0, description="Critic value clip range.")
    kl_coef: float = Field(0.001, ge=0.0, description="KL penalty coefficient beta.")
    kl_type: Literal["k1", "abs", "k2", "mse", "k3", "low_var_kl"] = Field("k1", description="KL estimator (Schulman 2020): k1, abs, k2/mse, k3/low_var_kl.")
    kl_in_reward: bool = Field(True, description="PPO: fold the KL into the reward (True) or add it to the actor loss (False).")
    entropy_coef: float = Field(0.0, ge=0.0, description="Entropy bonus coefficient.")
    gamma: float = Field(1.0, ge=0.0, le=1.0, description="GAE discount.")
    lam: float = Field(0.95, ge=0.0, le=1.0, description="GAE lambda.")
    loss_agg_mode: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = Field("token-mean", description="How per-token losses become one number.")
    norm_by_std: bool = Field(True, description="GRPO: divide group advantages by the group std (False: Dr.GRPO).")
    # -- sampling -------------------------------------------------------------
    temperature: float = Field(1.0, gt=0.0, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling threshold (1: off).")
    top_k: int = Field(0, ge=0, description="Top-k sampling (0: off).")
    # -- placement and execution ----------------------------------------------
    device_map: dict[str, str] = Field(default_factory=dict, description="Role -> device ('cpu', 'cuda:N'); roles not named go to cuda:0 when a GPU is present, else cpu. Alias 'rm' = reward.")
    executor: Literal["local", "ray"] = Field("local", description="Run on this machine (local) or on a Ray cluster (ray).")
    num_threads: int | None = Field(None, ge=1, description="torch CPU threads; None: torch's default.")
    seed: int = Field(0, description="Seed of the data order, sampling and model initialisation.")
    # -- loop ---------------------------------------------------------------
    eval_freq: int = Field(0, ge=0, description="Validate every this many steps (0: only before and after training).")
    val_samples: int = Field(4, ge=1, description="k of val mean@k (sampled responses per validation prompt).")
    save_freq: int = Field(0, ge=0, description="Checkpoint every this many steps (0: never).")
    output_dir: str = Field("runs/hybridflow", description="Where metrics, drawings, traces and checkpoints go.")
    log_every: int = Field(1, ge=1, description="Print metrics to the console every this many steps.")

    @field_validator("device_map")
    @classmethod
    def _devices_are_strings(cls, value: dict) -> dict:
        return {str(k): str(v) for k, v in value.items()}

    @model_validator(mode="after")
    def _sizes_agree(self) -> "PPOConfig":
        if self.batch_size and self.micro_batch_size and self.micro_batch_size > self.batch_size:
            raise ValueError(f"micro_batch_size ({self.micro_batch_size}) must not exceed batch_size ({self.batch_size})")
        return self


GRAPH_ATTRS: dict[str, str] = {
    "n_samples": "n", "clip_ratio": "clip_ratio", "value_clip": "value_clip", "kl_coef": "kl_coef",
    "kl_type": "kl_type", "entropy_coef": "entropy_coef", "gamma": "gamma", "lam": "lam",
    "loss_agg_mode": "loss_agg_mode", "norm_by_std": "norm_by_std",
}
"""Config field -> graph attribute it sets, for the algorithms that have that attribute."""


def config_error(err: ValidationError, where: str = "config") -> ConfigError:
    """A ConfigError naming each invalid field path and why."""
    lines = [f"  {'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}" for e in err.errors()]
    return ConfigError(f"invalid {where}:\n" + "\n".join(lines))
