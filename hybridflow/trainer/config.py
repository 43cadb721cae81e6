"""Typed trainer configuration: :class:`PPOConfig` and its relatives.

One flat pydantic model (the seed article writes ``PPOConfig(actor_model_name=...,
max_steps=..., batch_size=..., rollout_batch_size=...)``), validated once, with a
description on every field. Each trainer maps the fields it understands onto
its algorithm's graph attributes (:data:`GRAPH_ATTRS`, :data:`DERIVED_ATTRS`,
then ``algorithm_args``: :func:`algorithm_attrs`); the rest configure the
engines, the data and the loop.
"""
from __future__ import annotations

import difflib
import hashlib
import importlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from ..capabilities import DEFAULT_ROLLOUT_ENGINE, ROLLOUT_ENGINE_NAMES
from ..errors import ConfigError
from ..names import DEVICE_RE

__all__ = ["PPOConfig", "LRSchedule", "RewardServer", "GRAPH_ATTRS", "DERIVED_ATTRS", "algorithm_attrs", "field_attribute", "ROLE_SOURCE_FIELDS", "RUN_CONTROL_FIELDS", "TRACKERS", "OPS_TABLE_FIELDS", "ops_table_choices", "config_error",
           "config_hash"]

TRACKERS = ("console", "jsonl", "tensorboard", "wandb", "mlflow")
"""Tracker names the ``trackers`` field accepts."""
TrackerName = Literal[TRACKERS]
RolloutEngineName = Literal[ROLLOUT_ENGINE_NAMES]

OPS_TABLE_FIELDS = {"kl_type": "hybridflow_ops.kl.KL_TYPES",
                    "loss_agg_mode": "hybridflow_ops.losses.aggregate.LOSS_AGG_MODES"}
"""Fields whose value names an entry of a ``hybridflow_ops`` table (``module.TABLE``): the table is the one list of
choices. It is read when a config is validated, not when this module is imported (hybridflow_ops imports torch)."""


def ops_table_choices(field: str) -> tuple[str, ...]:
    """The values field ``field`` of :data:`OPS_TABLE_FIELDS` accepts: the keys of its ``hybridflow_ops`` table."""
    module, table = OPS_TABLE_FIELDS[field].rsplit(".", 1)
    return tuple(getattr(importlib.import_module(module), table))


class LRSchedule(BaseModel):
    """The learning-rate schedule of one trainable role (verl's ``optim`` section). Its steps are
    training steps, not optimizer steps: training step t (0-based) runs at the schedule's value for
    t in all of its mini-batches, whether or not their optimizer updates are taken (one skipped for
    a non-finite loss, counted in ``<role>/nan_skipped``, still uses up its value, as in verl; a
    zero-advantage mini-batch takes its zero-gradient step at that rate). So the rate of every step
    is known before the run, and a resumed run, a run that skipped updates and the plan agree.
    ``<role>/lr`` logs the rate of each step.

    A factor of the role's peak learning rate, stepped once per training step: a linear
    warm-up from ``lr / W`` to ``lr`` over the first ``W`` steps, then ``constant``, ``linear``
    or ``cosine`` decay to ``min_lr_ratio * lr`` at ``decay_steps`` (formulas in
    :mod:`hybridflow.runtime.engines.optim`). In YAML either a name (``actor_lr_schedule: cosine``)
    or a mapping (``actor_lr_schedule: {name: cosine, min_lr_ratio: 0.05}``); on the command
    line ``actor_lr_schedule.min_lr_ratio=0.05``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Literal["constant", "linear", "cosine"] = Field("constant", description="Decay after the warm-up: constant (none), linear or cosine.")
    warmup_steps: int = Field(0, ge=0, description="Training steps of linear warm-up; 0: warmup_ratio decides.")
    warmup_ratio: float = Field(0.0, ge=0.0, le=1.0, description="Warm-up as a fraction of decay_steps, used when warmup_steps is 0 (verl's lr_warmup_steps_ratio).")
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0, description="Learning rate at the end of the decay, as a fraction of the peak.")
    decay_steps: int | None = Field(None, ge=1, description="Training steps the schedule spans (warm-up included); None: the run's max_steps. Set it when a run will be resumed with a larger max_steps, so that the schedule does not change.")

    def engine_settings(self, max_steps: int) -> dict:
        """The :class:`~hybridflow.runtime.engines.TrainEngineConfig` fields of this schedule for a run of ``max_steps``."""
        total = self.decay_steps or max_steps
        warmup = self.warmup_steps or int(round(self.warmup_ratio * total))
        return {"lr_schedule": self.name, "warmup_steps": warmup, "total_steps": total, "min_lr_ratio": self.min_lr_ratio}


class RewardServer(BaseModel):
    """An HTTP reward server the reward role asks for scores (:class:`~hybridflow.rewards.RemoteRewardModel`; the
    request and reply formats are in ``docs/rewards.md``). In YAML ``reward_server: {url: http://host:8000/v1/rank,
    model_name: rm}``; on the command line ``reward_server.url=http://host:8000/v1/rank``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(description="The endpoint, e.g. http://localhost:8000/v1/rank (a path ending in rank or rerank: the rerank format).")
    model_name: str | None = Field(None, description="Sent as \"model\" in each request (the served model's name).")
    api_format: Literal["auto", "scores", "rerank"] = Field("auto", description="Request format: scores, rerank, or auto (rerank when the URL's path ends in rank or rerank).")
    batch_size: int = Field(64, ge=1, description="Responses per request.")
    timeout_s: float = Field(30.0, gt=0, description="Seconds to wait for each reply.")
    max_retries: int = Field(3, ge=0, description="Further attempts after a failed one (connection error, timeout, HTTP 408/429/5xx), with exponential back-off.")

    def source(self):
        """The :class:`~hybridflow.rewards.RemoteRewardModel` this describes."""
        from ..rewards import RemoteRewardModel

        return RemoteRewardModel(self.url, self.model_name, api_format=self.api_format, batch_size=self.batch_size,
                                 timeout=self.timeout_s, max_retries=self.max_retries)


def _schedule_from_name(value):
    """``"cosine"`` -> ``{"name": "cosine"}``: a schedule may be given by its name alone."""
    return {"name": value} if isinstance(value, str) else value


class PPOConfig(BaseModel):
    """Everything a training run needs; every algorithm's trainer takes this config."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # -- models ---------------------------------------------------------------
    actor_model_name: str | None = Field(None, description="Actor (policy) model: a local transformers folder or a hub name. None: a tiny model made in code for the built-in task.")
    critic_model_name: str | None = Field(None, description="Critic backbone (PPO); None: the actor's model.")
    ref_model_name: str | None = Field(None, description="Reference model for the KL term; None: the actor's initial model.")
    reward_model_name: str | None = Field(None, description="Sequence-classification reward model (path or hub name); a causal-LM checkpoint gets a new score head. None: the rule reward `reward_fn`.")
    reward_server: RewardServer | None = Field(None, description="HTTP reward server the reward role asks for scores: url, model_name, api_format, batch_size, timeout_s, max_retries (see RewardServer and docs/rewards.md). None: reward_model_name, else the rule reward reward_fn.")
    reward_fn: str = Field("hybridflow_ops.rewards:default_compute_score", description="Rule reward `module:function` with the signature compute_score(data_source, solution_str, ground_truth, extra_info=None).")
    reward_timeout_s: float | None = Field(300.0, gt=0, description="Longest a rule reward function (reward_fn, cost_fn) may take on one response before the run stops with a RewardError naming the sample; a first Ctrl-C while it runs stops the run within this bound. The function then runs on a helper thread; None: call it on the thread that runs the op and wait for ever (with executor='local' the main thread, which a function that sets signal handlers, e.g. signal.alarm, needs; a Ray worker runs its ops on a thread of its own, see docs/ray.md).")
    unfinished_score: float | None = Field(0.0, description="Score of a response that hit the length limit without EOS (None: score it like the others).")
    # -- data -----------------------------------------------------------------
    train_files: str | None = Field(None, description="Prompt dataset (.jsonl or .parquet with prompt, ground_truth, data_source). None: the built-in arithmetic task (all 100 prompts 'a+b=').")
    val_files: str | None = Field(None, description="Held-out prompts for validation; None: the training prompts.")
    empty_prompts: Literal["error", "skip"] = Field("error", description="A row whose prompt is empty (blank text, no chat message with content): 'error' refuses the dataset naming the rows, 'skip' leaves them out with a warning that counts them.")
    apply_chat_template: bool = Field(False, description="Format prompts with the tokenizer's chat template.")
    max_prompt_length: int = Field(512, ge=1, description="Prompts longer than this are an error.")
    max_response_length: int = Field(256, ge=1, description="Maximum new tokens per response.")
    # -- batch sizes ----------------------------------------------------------
    rollout_batch_size: int = Field(8, ge=1, description="Prompts sampled per training step.")
    n_samples: int = Field(1, ge=1, description="Responses per prompt (a group, for GRPO/RLOO); GRPO's default is 8 when left at 1.")
    batch_size: int | None = Field(None, ge=1, description="Responses per optimizer step (mini-batch); None: all responses of the step.")
    micro_batch_size: int | None = Field(None, ge=1, description="Responses per forward/backward (gradient accumulation); None: the mini-batch.")
    max_tokens_per_micro_batch: int | None = Field(None, ge=1, description="Form the actor's, critic's and reference's micro-batches by real tokens (prompt plus response, not padded width) rather than micro_batch_size rows: each holds at most this many (a longer response alone). The update is unchanged (losses use the mini-batch's token counts); data-parallel ranks get token-balanced shares. None: micro_batch_size.")
    pack_sequences: bool = Field(False, description="Run the actor's, critic's and reference's forward and backward on the micro-batch's rows packed into one row of real tokens (no padding; flash-attention varlen on CUDA where flash_attn is installed, else SDPA with a block-diagonal mask). The same log-probs, values and gradients as padded, up to float rounding.")
    ppo_epochs: int = Field(1, ge=1, description="Passes over the step's responses per update.")
    max_steps: int = Field(100, ge=1, description="Training steps (one rollout batch each).")
    max_time_s: float | None = Field(None, gt=0, description="Stop after the step during which this many seconds of training have passed (that step is validated and checkpointed like a last one; resume='auto' continues later). None: no limit.")
    # -- optimisation ---------------------------------------------------------
    actor_lr: float = Field(1e-6, ge=0.0, description="Actor learning rate (AdamW).")
    critic_lr: float = Field(1e-5, ge=0.0, description="Critic learning rate (AdamW).")
    actor_lr_schedule: LRSchedule = Field(default_factory=LRSchedule, description="Actor learning-rate schedule: name (constant | linear | cosine), warmup_steps, warmup_ratio, min_lr_ratio, decay_steps (see LRSchedule).")
    critic_lr_schedule: LRSchedule = Field(default_factory=LRSchedule, description="Critic learning-rate schedule, as actor_lr_schedule.")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay.")
    adam_betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW (beta1, beta2).")
    max_grad_norm: float | None = Field(1.0, gt=0.0, description="Gradient clipping norm; None: no clipping.")
    # -- LoRA -----------------------------------------------------------------
    lora_rank: int = Field(0, ge=0, description="Rank r of LoRA adapters on the actor (needs peft: `pip install hybridflow[lora]`): only the adapters train, are synced into the rollout engine and are checkpointed; the reference log-probs come from the same module with the adapters disabled; `hybridflow export` merges them. 0: full fine-tune. LoRA usually wants a higher actor_lr (1e-4 to 5e-3).")
    lora_alpha: float = Field(16.0, gt=0.0, description="LoRA scale: the adapters' output is multiplied by lora_alpha / lora_rank.")
    lora_target_modules: list[str] | str = Field("all-linear", description="Linear layers of the actor that get adapters: 'all-linear' (every linear layer of the decoder blocks; not the output layer) or their names, e.g. [q_proj, v_proj] (a comma-separated string on the command line).")
    # -- algorithm ------------------------------------------------------------
    clip_ratio: float = Field(0.2, gt=0.0, description="PPO clip range epsilon (both sides).")
    clip_ratio_low: float | None = Field(None, gt=0.0, description="Lower clip range epsilon_low, for algorithms with a clip_low attribute (decoupled clipping, DAPO's clip-higher); None: the algorithm's default.")
    clip_ratio_high: float | None = Field(None, gt=0.0, description="Upper clip range epsilon_high, for algorithms with a clip_high attribute; None: the algorithm's default.")
    value_clip: float = Field(0.2, gt=0.0, description="Critic value clip range.")
    kl_coef: float = Field(0.001, ge=0.0, description="KL penalty coefficient beta.")
    kl_type: str = Field("k1", description="KL estimator (Schulman 2020): k1/kl, abs, k2/mse, k3/low_var_kl; a trailing '+' (k1+, abs+, k3+) is the straight-through variant: the value of the named estimator with the gradient of k2 (hybridflow_ops.kl).")
    kl_in_reward: bool = Field(True, description="PPO: fold the KL into the reward (True) or add it to the actor loss (False).")
    entropy_coef: float = Field(0.0, ge=0.0, description="Entropy bonus coefficient.")
    gamma: float = Field(1.0, ge=0.0, le=1.0, description="GAE discount.")
    lam: float = Field(0.95, ge=0.0, le=1.0, description="GAE lambda.")
    loss_agg_mode: str = Field("token-mean", description="How per-token losses become one number (hybridflow_ops.losses.aggregate): token-mean, seq-mean-token-sum, seq-mean-token-mean, seq-mean-token-sum-norm (Dr.GRPO), token-sum (no normaliser).")
    recompute_old_log_probs: bool = Field(True, description="GRPO: PPO's old log-probs from an actor logprob node (True; served from the rollout where reuse_rollout_log_probs applies) or always from the rollout engine (False: one forward less per step; exact on-policy with the transformers rollout engine).")
    reuse_rollout_log_probs: bool = Field(True, description="Let the compiler serve the actor's logprob node from its rollout's log-probs where they are provably the same numbers (the rollout engine shares the train engine's module on one device, fp32: CPU runs, staleness 0; compiler pass 'reuse'): one actor forward less per step. False: always recompute.")
    norm_by_std: bool = Field(True, description="GRPO: divide group advantages by the group std (False: Dr.GRPO).")
    # -- the algorithm's own attributes ---------------------------------------
    algorithm_args: dict[str, bool | int | float | str | None] = Field(default_factory=dict, description="Attributes passed straight to the algorithm's build (its keyword-only parameters), e.g. {len_penalty: 0.01}; an attribute named here wins over a standard field mapped onto it (ALGORITHM_FIELDS). An attribute the algorithm does not have is an error.")
    imports: tuple[str, ...] = Field((), description="Modules imported before the algorithm is resolved and built, e.g. the one that registers custom ops with @hf.register_op (the working directory is on the import path).")
    # -- cost constraint (Safe-RLHF) --------------------------------------------
    cost_fn: str | None = Field(None, description="Safe-RLHF: rule cost `module:function` with the signature compute_score(data_source, solution_str, ground_truth, extra_info=None), returning the response's cost (higher: less safe). A run with a cost role needs this or cost_model_name.")
    cost_model_name: str | None = Field(None, description="Safe-RLHF: sequence-classification cost model (path or hub name); its score is the cost. None: the rule cost `cost_fn`.")
    cost_limit: float = Field(0.0, description="Safe-RLHF: the constraint's threshold d on the mean episode cost (mean over a step's responses).")
    lagrange_lambda: float = Field(1.0, ge=0.0, description="Safe-RLHF: initial Lagrange multiplier lambda (the weight of the cost advantage).")
    lambda_lr: float = Field(0.01, ge=0.0, description="Safe-RLHF: step size of the multiplier, lambda <- max(0, lambda + lambda_lr * (mean cost - cost_limit)) after each step.")
    # -- sampling -------------------------------------------------------------
    temperature: float = Field(1.0, gt=0.0, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling threshold (1: off).")
    top_k: int = Field(0, ge=0, description="Top-k sampling (0: off).")
    # -- rollout engine ---------------------------------------------------------
    rollout_engine: RolloutEngineName = Field(DEFAULT_ROLLOUT_ENGINE, description="The policy's rollout engine: hf (transformers, KV-cached sampling; samples from the train module itself on one device) or vllm (vLLM with the trained weights pushed in after each update; needs `make vllm-env`, see docs/rollout_engines.md). Recorded in the plan's role placement.")
    rollout_engine_options: dict[str, Any] = Field(default_factory=dict, description="Options of the rollout engine, checked against its options model: hf: micro_batch_size, keep_products; vllm: dtype, max_model_len, tensor_parallel_size, gpu_memory_utilization, kv_cache_gib (CPU), max_num_seqs, enforce_eager, sleep_mode (CUDA), weight_transfer (direct | shm).")
    # -- placement and execution ----------------------------------------------
    device_map: dict[str, str] = Field(default_factory=dict, description="Role -> device ('cpu', 'cuda:N'); roles not named go to cuda:0 when a GPU is present, else cpu. Alias 'rm' = reward.")
    executor: Literal["local", "ray"] = Field("local", description="Run on this machine (local) or on a Ray cluster (ray).")
    placement: str = Field("auto", description="How the compiler places the roles on the run's devices: auto (its search), colocate, split, standalone, a pool spec 'actor+ref@1;critic@1' (ROLE.generate@N: a rollout pool of its own), or a device map 'actor=cuda:0,critic=cuda:1' (device_map does the same as a dict). The plan that runs is written to output_dir/plan.json.")
    ray_address: str | None = Field(None, description="executor='ray': the Ray cluster to join, 'auto' (the one `ray start` set up on this machine) or 'HOST:PORT' (its head's GCS address; 'ray://HOST:10001' for Ray Client); None: start a Ray instance on this machine for the run.")
    staleness: int = Field(0, ge=0, description="0: on-policy. k >= 1: generation runs up to k steps ahead of training on a rollout pool of its own (executor='ray'): a bounded buffer of at most k rollouts, the one trained at step i sampled by weights k updates old (fewer for the first k steps); each token records the version that sampled it (rollout field policy_version; metrics rollout/staleness, rollout/staleness_max). A policy-gradient loss then needs an off-policy correction; compiling one without fails with StalenessError. Recommended for GRPO: recompute_old_log_probs=false, whose PPO ratio against the rollout's own log-probs clips the whole lag (0.9 greedy accuracy on 5 of 5 seeds on the arithmetic task at k = 2, and at k = 4 with a 2,000-step LR schedule; docs/concepts.md); algorithm grpo_is (truncated_is_weight + ppo_clip_is) and grpo_decoupled are the others. A checkpoint saves the loader's position before the prompts drawn ahead: a resume generates them again with the restored weights.")
    stream_rollouts: bool = Field(False, description="Stream the rollout: each prompt group goes on to scoring, log-probs and group advantages as soon as its n responses have ended, and the pieces are joined in prompt order before the first batch-wise op or update (the same numbers as without streaming). Pays off when response lengths vary widely and those ops run on pools of their own (executor='ray'); hf rollout engine, single-turn rollouts.")
    partial_rollouts: Literal["finish", "continue"] = Field("finish", description="staleness >= 1: what a generation running ahead does when the step training beside it updates the policy. finish: it runs whole with the weights it started with. continue: it runs in segments of partial_segment_tokens tokens, and at the first segment boundary after the update the new weights are synced to the rollout pool and the unfinished responses go on under them, keeping their tokens and log-probs (AReaL's interruptible generation, verl's partial rollout). Each token's weights are recorded in the rollout's policy_version field. Single-turn generate nodes; on hf a continuation with unchanged weights goes on from its kept KV cache (cutting changes nothing), on vllm each unfinished response is resubmitted with its kept tokens.")
    async_weight_sync: Literal["collective", "staged"] = Field("collective", description="staleness >= 1: how each new policy version reaches the rollout pool (the same field feeds the compiler's CostOptions.async_weight_sync, so the plan's predicted step and the placement search assume what the run does). collective: one weight-sync collective of both pools after each update, so the trainer waits for the generation in progress and the pools move in lock step (k >= 2 is no faster than k = 1). staged: the train pool leaves each version's full weights in a staging buffer (host memory; on Ray the object store) and the rollout pool loads the version it needs just before the generation that needs it, so it runs up to k generations ahead while the trainer trains, bounded by data only; costs the train pool a gather and a host copy per update. staged needs staleness >= 1, executor='ray' and partial_rollouts=finish (hybridflow.runtime.staged_sync).")
    partial_segment_tokens: int = Field(8, ge=1, description="partial_rollouts=continue: positions decoded per segment; the policy's new weights are taken up at the first boundary after an update (smaller: sooner, at one more generate op per segment).")
    allow_uncorrected_staleness: bool = Field(False, description="staleness > 0: compile and run an algorithm whose policy-gradient loss has no off-policy correction anyway (a warning; the gradient is biased by the k-updates-old rollout). For runs about scheduling, not learning.")
    plan: str | None = Field(None, description="A plan file to run exactly, instead of compiling one: from 'hybridflow compile CONFIG.yaml [key=value ...] --cluster local -o PLAN.json' (the plan this config compiles) or a run's plan.json; its graph must be the one this config builds, and this machine must have its devices.")
    calibrate: bool = Field(True, description="Profile the run's models on this machine before compiling (a few seconds, cached under ~/.cache/hybridflow or HYBRIDFLOW_CACHE), so the plan's predicted times are this machine's; False: datasheet figures.")
    calibrate_quick: bool = Field(True, description="calibrate: profile a model deeper than 2 layers as copies 1 and 2 layers deep, extrapolated to its depth, at batch sizes sized to the model (seconds, and less memory than the run: about 2.5 s of CPU and 0.1 GB on the ~8M model, one thread); False: the whole model at batch sizes 16, 128 and 512 (about 60 s of CPU and 2.1-2.4 GB on the ~8M model).")
    calibrate_drift: float | None = Field(0.5, gt=0.0, description="calibrate: after steps 1-3 (step 0 warms up) the median step time is compared with the plan's prediction; beyond a factor of 1 + calibrate_drift either way the cached profile is dropped (or, one borrowed from another load level, not kept for this one) and the next start measures again; within it, a profile borrowed from another load level is kept for this level too. None: no check (a profile is then measured at each load level).")
    cpu_slots: int | None = Field(None, ge=1, description="Without a GPU: how many device slots the CPU is cut into (each a share of the cores; on Ray one process per slot). None: 1 for executor='local', min(4, cores) on Ray.")
    env_workers: int = Field(2, ge=1, description="Multi-turn rollouts (a generate node with env=): the environment worker processes of each generating role's environment pool (the plan's `env` pool: on Ray, actors on host CPUs that hold whole samples' environments and step them on threads; locally the rollout worker's threads). The compiler prices tool time over them.")
    num_threads: int | None = Field(None, ge=1, description="torch CPU threads; None: torch's default.")
    seed: int = Field(0, description="Seed of the data order, sampling and model initialisation.")
    # -- loop ---------------------------------------------------------------
    trajectory_log_samples: int = Field(4, ge=0, description="Multi-turn rollouts: trajectories per step appended to output_dir/trajectories.jsonl (read them with `hybridflow trajectories`); 0: none.")
    eval_freq: int = Field(0, ge=0, description="Validate every this many steps (0: only before and after training).")
    stop_at_val_score: float | None = Field(None, description="Stop once a validation's greedy score (val/score/greedy) reaches this; None: run all steps.")
    val_samples: int = Field(4, ge=1, description="k of val mean@k (sampled responses per validation prompt).")
    save_freq: int = Field(0, ge=0, description="Checkpoint every this many steps (0: never).")
    output_dir: str = Field("runs/hybridflow", description="Where metrics, drawings, traces and checkpoints go.")
    log_every: int = Field(1, ge=1, description="Print metrics to the console every this many steps.")
    # -- checkpoints and resumption -------------------------------------------
    resume: str = Field("auto", description="'auto': continue from the newest complete checkpoint in output_dir/checkpoints (a fresh start when there is none); 'never': start fresh (an error if output_dir holds checkpoints, unless overwrite=true); or the path of one checkpoint folder.")
    overwrite: bool = Field(False, description="With resume='never': delete the checkpoints an earlier run left in output_dir/checkpoints and start fresh (False: such a folder is an error, so that no run is lost by mistake).")
    save_on_interrupt: bool = Field(True, description="On a first SIGINT (Ctrl-C) or SIGTERM, finish the current step and checkpoint it before stopping, whatever save_freq says (False: stop without a checkpoint).")
    keep_checkpoints: int = Field(3, ge=1, description="Keep the newest this many checkpoints; older ones are deleted after each save.")
    check_contracts: bool = Field(True, description="Check every node's outputs against the graph's declarations as the run goes (dtype, shape against the dims B, R, ..., finiteness of compute ops' float outputs); a breach is a ContractError naming the node. False, or HYBRIDFLOW_CHECK_CONTRACTS=0 in the environment, turns the checks off.")
    record_hashes: bool = Field(False, description="Write a digest (blake2b of the bytes) of every tensor of every node's output, as the controller holds it after the node's results are merged, to output_dir/hashes.jsonl after each step (step, node, field, digest, pool): `hybridflow diff RUN_A RUN_B` then names the first step and edge where two runs' values differ. Costs well under 1% of a step on the built-in task (tools/bench_hashes.py).")
    check_determinism: int = Field(0, ge=0, description="Before training, run the first this many steps twice (two fresh trainers with record_hashes, same seed, in output_dir/determinism/a and b) and report the first edge whose values differ, or 'bit-identical'; then the run proceeds as configured. The report goes to the log and output_dir/determinism.txt; the two folders are kept only when they differ (compare them with `hybridflow diff`). 0: no check.")
    max_nan_steps: int = Field(3, ge=1, description="Abort after this many steps in a row whose update skipped a mini-batch for a non-finite loss or gradient norm.")
    max_restarts: int = Field(0, ge=0, description="executor='ray': how many times a run whose worker process died recreates the worker group and continues from its newest checkpoint (needs save_freq > 0); 0: the error ends the run.")
    hang_timeout_s: float | None = Field(1800.0, gt=0, description="The hang watchdog: when no op of a running plan (a step, a validation, a checkpoint) completes for this many seconds, the run prints, and writes to output_dir/hang.txt, what each pool and rank is doing (the op, its iteration and step, for how long, the last op it completed, the workers' and the controller's Python stacks), then does what on_hang says. The default is far above any op of a healthy run (a generation, a checkpoint write) and far below the hours a silent hang wastes. None: no watchdog.")
    on_hang: Literal["stop", "wait"] = Field("stop", description="What the run does after the hang watchdog's report: stop (a HangError naming the ops in flight; the workers are stopped, resume='auto' continues from the newest checkpoint) or wait (keep waiting; a stall that goes on is not reported again, the next one is).")
    # -- tracking -----------------------------------------------------------
    trackers: tuple[TrackerName, ...] = Field(("console", "jsonl", "tensorboard"), description="Where metrics go: console, jsonl (output_dir/metrics.jsonl), tensorboard (output_dir/tensorboard), wandb and mlflow (offline unless WANDB_MODE / MLFLOW_TRACKING_URI say otherwise). A default tracker whose package is missing is skipped with a warning; one named explicitly is an error.")
    progress_bar: bool = Field(True, description="Show a progress bar over steps (ETA, live mean reward, current phase) when the output is a terminal.")
    project_name: str = Field("hybridflow", description="W&B project / MLflow experiment name.")
    experiment_name: str | None = Field(None, description="W&B / MLflow run name; None: the output_dir's folder name.")

    def __init__(self, **data):
        try:
            super().__init__(**data)
        except ValidationError as err:
            raise config_error(err, "PPOConfig") from None

    def lora_settings(self):
        """The actor's :class:`~hybridflow.runtime.engines.lora.LoraSettings`; None for a full fine-tune (lora_rank 0)."""
        if not self.lora_rank:
            return None
        from ..runtime.engines.lora import LoraSettings

        return LoraSettings(rank=self.lora_rank, alpha=self.lora_alpha, target_modules=self.lora_target_modules)

    def __setattr__(self, name: str, value) -> None:
        """Assignments are validated like the constructor's arguments (``config.device_map = {...}``)."""
        if name not in type(self).model_fields and not name.startswith("_"):
            raise ConfigError(f"PPOConfig has no field {name!r}{_suggestion(name)}")
        try:
            super().__setattr__(name, value)
        except ValidationError as err:
            raise config_error(err, f"PPOConfig.{name}") from None

    @field_validator("actor_lr_schedule", "critic_lr_schedule", mode="before")
    @classmethod
    def _schedule_name(cls, value):
        return _schedule_from_name(value)

    @field_validator("lora_target_modules", mode="before")
    @classmethod
    def _lora_targets(cls, value):
        from ..runtime.engines.lora import parse_target_modules

        targets = parse_target_modules(value)
        return targets if isinstance(targets, str) else list(targets)

    @field_validator(*OPS_TABLE_FIELDS, mode="before")
    @classmethod
    def _an_ops_table_entry(cls, value, info: ValidationInfo):
        choices = ops_table_choices(info.field_name)
        if not isinstance(value, str) or value not in choices:
            listed = [repr(c) for c in choices]
            expected = " or ".join([", ".join(listed[:-1]), listed[-1]] if len(listed) > 1 else listed)
            raise PydanticCustomError("literal_error", "Input should be {expected}", {"expected": expected})
        return value

    @field_validator("device_map")
    @classmethod
    def _devices_are_devices(cls, value: dict) -> dict:
        out = {}
        for key, device in value.items():
            text = str(device).strip().lower()
            if not DEVICE_RE.match(text):
                raise ValueError(f"device_map[{key!r}] = {device!r} is not a device; use 'cpu', 'cuda', 'cuda:N' or 'mps'")
            out[str(key)] = text
        return out

    @field_validator("resume")
    @classmethod
    def _resume_mode(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("resume must be 'auto', 'never' or the path of a checkpoint folder")
        return value.strip()

    @model_validator(mode="after")
    def _rollout_options_known(self) -> "PPOConfig":
        from ..runtime.engines.registry import rollout_options

        try:
            rollout_options(self.rollout_engine, self.rollout_engine_options)
        except ConfigError as err:
            raise ValueError(str(err)) from None
        return self

    @model_validator(mode="after")
    def _partial_rollouts_apply(self) -> "PPOConfig":
        if self.partial_rollouts == "continue" and self.staleness == 0:
            raise ValueError("partial_rollouts=continue cuts a generation that runs ahead of training, which needs "
                             "staleness >= 1 (executor='ray'); set staleness=1, or partial_rollouts=finish")
        return self

    @model_validator(mode="after")
    def _weight_sync_applies(self) -> "PPOConfig":
        from ..runtime.staged_sync import check_weight_sync

        try:
            check_weight_sync(self.async_weight_sync, staleness=self.staleness, executor=self.executor,
                              partial_rollouts=self.partial_rollouts)
        except ConfigError as err:
            raise ValueError(str(err)) from None
        return self

    @model_validator(mode="after")
    def _one_reward_source(self) -> "PPOConfig":
        if self.reward_server is not None and self.reward_model_name:
            raise ValueError(f"reward_server ({self.reward_server.url}) and reward_model_name ({self.reward_model_name!r}) "
                             "both name the reward; give one of them")
        return self

    @model_validator(mode="after")
    def _sizes_agree(self) -> "PPOConfig":
        if self.batch_size and self.micro_batch_size and self.micro_batch_size > self.batch_size:
            raise ValueError(f"micro_batch_size ({self.micro_batch_size}) must not exceed batch_size ({self.batch_size})")
        if self.overwrite and self.resume != "never":
            raise ValueError(f"overwrite=true deletes an earlier run's checkpoints and so needs resume='never' "
                             f"(resume is {self.resume!r}); set resume=never, or drop overwrite to keep them")
        return self


GRAPH_ATTRS: dict[str, str] = {
    "n_samples": "n", "clip_ratio": "clip_ratio", "clip_ratio_low": "clip_low", "clip_ratio_high": "clip_high",
    "value_clip": "value_clip", "kl_coef": "kl_coef",
    "kl_type": "kl_type", "entropy_coef": "entropy_coef", "gamma": "gamma", "lam": "lam",
    "loss_agg_mode": "loss_agg_mode", "norm_by_std": "norm_by_std",
    "recompute_old_log_probs": "recompute_old_log_probs",
    "cost_limit": "cost_limit", "lagrange_lambda": "lagrange_lambda", "lambda_lr": "lambda_lr",
}
"""Config field -> graph attribute it sets, for the algorithms that have that attribute (when the field is set)."""

DERIVED_ATTRS: dict[str, tuple[str, str]] = {
    "kl_in_reward": ("kl_as_loss", "not kl_in_reward (always passed, set or not)"),
    "kl_coef": ("kl_loss", "kl_coef > 0 (kl_coef=0: no KL term and no reference model)"),
}
"""Config field -> (graph attribute, how its value is derived), for attributes that are not a copy of a field."""


def algorithm_attrs(config: "PPOConfig", defaults: dict) -> dict[str, object]:
    """The attributes ``config`` gives an algorithm whose attributes (with defaults) are ``defaults``.

    A standard field reaches attribute :data:`GRAPH_ATTRS` [field] when the field was set and the
    algorithm has the attribute; :data:`DERIVED_ATTRS` are computed; ``algorithm_args`` win over both.
    """
    attrs = {attr: getattr(config, field) for field, attr in GRAPH_ATTRS.items()
             if attr in defaults and field in config.model_fields_set}
    if "kl_as_loss" in defaults:
        attrs["kl_as_loss"] = not config.kl_in_reward
    if "kl_loss" in defaults and "kl_coef" in config.model_fields_set:
        attrs["kl_loss"] = config.kl_coef > 0
    attrs.update(config.algorithm_args)
    return attrs


def field_attribute(field: str) -> str | None:
    """``"n_samples"`` -> ``"n"``: the algorithm attribute a standard config field sets (with how, if derived)."""
    if field in DERIVED_ATTRS:
        attr, how = DERIVED_ATTRS[field]
        first = f"{GRAPH_ATTRS[field]}; " if field in GRAPH_ATTRS else ""
        return f"{first}{attr} = {how}"
    return GRAPH_ATTRS.get(field)

ROLE_SOURCE_FIELDS: dict[str, str] = {"cost_fn": "cost", "cost_model_name": "cost"}
"""Config field -> the role kind it gives a source to; ignored (with a warning) by algorithms without that role."""


RUN_CONTROL_FIELDS = frozenset({
    "max_steps", "max_time_s", "output_dir", "log_every", "resume", "keep_checkpoints", "save_freq", "eval_freq", "trackers",
    "progress_bar", "project_name", "experiment_name", "num_threads", "max_nan_steps", "stop_at_val_score",
    "max_restarts", "overwrite", "save_on_interrupt", "placement", "cpu_slots", "plan", "calibrate", "calibrate_quick", "calibrate_drift", "check_contracts",
    "imports", "ray_address", "trajectory_log_samples", "record_hashes", "check_determinism", "hang_timeout_s", "on_hang",
})
"""Fields that may change when a run is resumed (they steer the loop, not what is learned); left out of the hash."""


def config_hash(config: PPOConfig) -> str:
    """sha256 of the config's JSON without :data:`RUN_CONTROL_FIELDS`: equal hashes, same learning problem."""
    data = config.model_dump(mode="json", exclude=set(RUN_CONTROL_FIELDS))
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


MOVED_FIELDS: dict[str, str] = {
    "warmup_steps": "actor_lr_schedule.warmup_steps (and critic_lr_schedule.warmup_steps): schedules are per role",
}
"""Fields that were renamed or moved -> where they are now (named in the unknown-field error)."""


def _suggestion(name: str) -> str:
    if name in MOVED_FIELDS:
        return f"; it moved to {MOVED_FIELDS[name]}"
    close = difflib.get_close_matches(name, PPOConfig.model_fields, n=1)
    return f"; did you mean {close[0]!r}?" if close else "; see `hybridflow run --fields` for the fields"


def config_error(err: ValidationError, where: str = "config") -> ConfigError:
    """A ConfigError naming each invalid field path and why (with the closest field name for unknown keys)."""
    lines = []
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"]) or "(root)"
        if e["type"] == "extra_forbidden":
            lines.append(f"  {path}: unknown field{_suggestion(str(e['loc'][-1]))}")
        else:
            got = f" (got {e['input']!r})" if not isinstance(e.get("input"), (dict, BaseModel)) else ""
            lines.append(f"  {path}: {e['msg']}{got}")
    return ConfigError(f"invalid {where}:\n" + "\n".join(lines))
