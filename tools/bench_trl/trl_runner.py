"""TRL's side of tools/bench_vs_trl.py: one GRPOTrainer learning run, recorded step by step.

Run inside the TRL virtual environment (never hybridflow's):
    .venv-trl/bin/python tools/bench_trl/trl_runner.py RUN_CONFIG.json

Imports nothing from hybridflow: the model folder, the settings and the shared task /
reward / greedy-evaluation code (common.py, beside this file) come by path. The settings
are made equal to hybridflow's GRPO recipe (see tools/bench_vs_trl.py for the list);
``variant["args"]`` of the RunConfig overrides GRPOConfig fields for diagnosis
experiments (e.g. ``{"bf16": true}`` for GRPOConfig's own default precision), and
``variant["reseed"]`` (an int, or ``"rollout"``) reseeds torch's global generator after the
trainer is built, just before training: GRPOTrainer calls ``set_seed(seed)`` in its constructor,
so by default its sampling replays the stream ``torch.manual_seed(seed)`` that drew the model
folder's initial weights; ``"rollout"`` uses the seed hybridflow's rollout stream gets
(hybridflow.trainer.seeds.stream_seed(seed, "rollout"), the same hash written out here).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RunConfig, arithmetic_rows, exact_sum_score, greedy_accuracy, load_tokenizer, write_record  # noqa: E402

# TRL log keys -> the record's names
METRICS = {"grad_norm": "grad_norm", "entropy": "entropy", "completions/mean_length": "response_length",
           "reward": "reward", "learning_rate": "lr", "clip_ratio/region_mean": "clipfrac"}


def rollout_stream_seed(seed: int) -> int:
    """hybridflow's seed of a run's rollout sampling stream (hybridflow.trainer.seeds.stream_seed, not imported)."""
    return int.from_bytes(hashlib.sha256(f"hybridflow/rollout/{seed}".encode()).digest()[:8], "little") >> 1


def grpo_args(cfg: RunConfig, output_dir: str):
    """GRPOConfig equal to hybridflow's recipe at ``cfg``'s settings."""
    from trl import GRPOConfig

    args = dict(
        output_dir=output_dir, seed=cfg.seed, max_steps=cfg.steps, learning_rate=cfg.lr,
        lr_scheduler_type=cfg.lr_schedule, warmup_steps=0, weight_decay=0.0,
        adam_beta1=cfg.betas[0], adam_beta2=cfg.betas[1], adam_epsilon=cfg.adam_eps, max_grad_norm=cfg.max_grad_norm,
        per_device_train_batch_size=cfg.prompts * cfg.group, gradient_accumulation_steps=1, num_iterations=1,
        num_generations=cfg.group, max_completion_length=cfg.max_new_tokens, temperature=cfg.temperature,
        top_p=1.0, top_k=0, min_p=None, repetition_penalty=1.0,
        beta=0.0, epsilon=cfg.clip, loss_type="dapo", scale_rewards="group", mask_truncated_completions=False,
        bf16=False, use_cpu=True, gradient_checkpointing=False, disable_dropout=True, shuffle_dataset=True,
        logging_steps=1, save_strategy="no", report_to="none", dataloader_num_workers=0, log_completions=False,
        remove_unused_columns=False, disable_tqdm=True,
    )
    args.update(cfg.variant.get("args", {}))
    return GRPOConfig(**args)


def run(cfg: RunConfig) -> None:
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOTrainer

    torch.set_num_threads(cfg.threads)
    rows, tokenizer = arithmetic_rows(), load_tokenizer(cfg.model_dir)
    eos = tokenizer.eos_token_id
    model = AutoModelForCausalLM.from_pretrained(cfg.model_dir, dtype=torch.float32)

    step_prompts: list[list[str]] = []  # each step's distinct prompts, in order (the reward sees them all)

    def exact_sum(prompts, completions, completion_ids, ground_truth, **_):
        """common.exact_sum_score on the completion's token ids (TRL's text drops special tokens)."""
        step_prompts.append(list(prompts[::cfg.group]))
        return [exact_sum_score(ids, truth, tokenizer, eos) for ids, truth in zip(completion_ids, ground_truth)]

    steps: list[dict] = []
    evals: list[dict] = []
    generation_clock = [0.0, 0.0]  # (wall, CPU) seconds in GRPOTrainer._generate since the step began

    class Record(TrainerCallback):
        """Per-step metrics from TRL's logs; greedy accuracy every ``eval_every`` steps."""

        started = started_cpu = 0.0

        def on_train_begin(self, args, state, control, model=None, **kw):
            if cfg.eval_every == 0:  # no evaluation
                return
            evals.append({"step": 0, "greedy_accuracy": greedy_accuracy(model, tokenizer, rows, cfg.max_new_tokens)})

        def on_step_begin(self, args, state, control, **kw):
            self.started, self.started_cpu = time.perf_counter(), time.process_time()
            generation_clock[:] = [0.0, 0.0]

        def on_step_end(self, args, state, control, model=None, **kw):
            elapsed, cpu = time.perf_counter() - self.started, time.process_time() - self.started_cpu
            steps.append({"step": state.global_step, "time_s": elapsed, "cpu_s": cpu, "gen_s": generation_clock[0],
                          "gen_cpu_s": generation_clock[1], "prompts": step_prompts[-1] if step_prompts else None})
            if cfg.eval_every and (state.global_step % cfg.eval_every == 0 or state.global_step == cfg.steps):
                acc = greedy_accuracy(model, tokenizer, rows, cfg.max_new_tokens)
                evals.append({"step": state.global_step, "greedy_accuracy": acc})

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "grad_norm" in logs and steps and steps[-1]["step"] == state.global_step:
                steps[-1].update({name: float(logs[key]) for key, name in METRICS.items() if logs.get(key) is not None})

    dataset = Dataset.from_list(rows)
    out_dir = str(Path(cfg.out).with_suffix("")) + "_trl"
    trainer = GRPOTrainer(model=model, reward_funcs=exact_sum, args=grpo_args(cfg, out_dir), train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[Record()])
    generate = trainer._generate

    def timed_generate(*args, **kwargs):
        """GRPOTrainer._generate (sampling, decoding the text) timed on both clocks: the record's gen_s / gen_cpu_s."""
        start, start_cpu = time.perf_counter(), time.process_time()
        try:
            return generate(*args, **kwargs)
        finally:
            generation_clock[0] += time.perf_counter() - start
            generation_clock[1] += time.process_time() - start_cpu

    trainer._generate = timed_generate
    generation = {k: getattr(trainer.generation_config, k, None)
                  for k in ("do_sample", "temperature", "top_k", "top_p", "min_p", "repetition_penalty", "max_new_tokens")}
    reseed = cfg.variant.get("reseed")
    if reseed is not None:
        torch.manual_seed(rollout_stream_seed(cfg.seed) if reseed == "rollout" else int(reseed))
    start = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - start
    write_record(cfg.out, framework="trl", config=cfg, steps=steps, evals=evals, wall_s=wall,
                 extra={"trl_version": trl.__version__, "torch_version": torch.__version__, "generation_config": generation,
                        "lr_scheduler_type": str(trainer.args.lr_scheduler_type), "bf16": bool(trainer.args.bf16)})


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", help="RunConfig JSON file (tools/bench_vs_trl.py writes them)")
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    run(RunConfig.load(args.config))


if __name__ == "__main__":
    main()
