"""hybridflow's side of tools/bench_vs_trl.py: one GRPO learning run, recorded step by step.

Run with hybridflow's Python:  python tools/bench_trl/hybridflow_runner.py RUN_CONFIG.json
(and ``--make-model DIR --seed S`` to write the model folder both sides start from).

The run is the GRPO recipe of examples/grpo_arith/train.py at the settings of the
RunConfig: rollout log-probs as PPO's old log-probs, token-mean loss, group advantages
divided by the group std, no KL, no weight decay. ``variant`` switches of the RunConfig
(diagnosis experiments; none by default):

- ``train``: fields of TrainEngineConfig to override (e.g. ``{"skip_vanishing_rows": false}``),
- ``config``: fields of PPOConfig to override (e.g. ``{"recompute_old_log_probs": true}``),
- ``plain_logprobs``: true computes log-probs from the model's full logits instead of the fused
  lm_head op (hybridflow.runtime.engines.lm_logprobs falls back to it for non-linear heads),
- ``sampling_seed``: seed of the rollout engine's sampling generator alone (default:
  stream_seed(seed, "rollout")); ``"run"`` is the run's seed itself, so the sampler replays the
  stream ``torch.manual_seed(seed)`` that drew the model folder's initial weights, as TRL's does,
- ``sampling_skip``: draw this many numbers from the sampling generator before the first rollout
  (the same seed, its stream shifted),
- ``joined_forward``: true runs every row's prompt in the train engine's forward (the code before
  hybridflow.runtime.engines.shared_prompt: each distinct prompt once),
- ``trl_prompt_order``: true draws each epoch's prompt order as TRL's RepeatSampler does (one
  ``torch.randperm`` per epoch from a ``torch.Generator`` seeded with the run's seed) instead of
  hybridflow's PromptLoader order (a numpy permutation per (seed, epoch)): the same prompts per step
  as the TRL run of that seed (bench_vs_trl.py learn sets it beside TRL unless --own-prompt-order),
- ``hf_generate``: true samples with transformers' ``model.generate`` (TRL's sampler, global RNG)
  instead of hybridflow's decode loop; the rollout log-probs then come from a full forward.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RunConfig, arithmetic_rows, greedy_accuracy, load_tokenizer, set_stop_logits, write_record  # noqa: E402

# metric keys of a hybridflow GRPO step -> the record's names
METRICS = {"actor/grad_norm": "grad_norm", "actor/entropy": "entropy", "response_length/mean": "response_length",
           "critic/score/mean": "reward", "reward/score/mean": "reward",  # GRPO has no critic: reward/score/mean
           "actor/lr": "lr", "actor/pg_clipfrac": "clipfrac", "actor/ppo_kl": "ppo_kl"}


from hybridflow.data.tiny import BENCH_MODELS as MODEL_SIZES  # noqa: E402  (tiny ~130k, 10m ~7.9M, 100m ~104M parameters)


def make_model(path: Path, seed: int, size: str = "tiny", lengths: int = 0) -> None:
    """The built-in task's model (hybridflow.trainer.setup): random weights, 40 format-only warm-up steps.

    ``lengths > 0`` (the speed benchmark's folder): random weights without the warm-up, whose EOS
    logit is set (common.set_stop_logits) so that sampled responses average half of ``lengths``
    tokens, spread geometrically over the budget; the achieved mean is printed.
    """
    from hybridflow.data import create_tiny_model_dir, load_causal_lm
    from hybridflow.data import load_tokenizer as hf_tokenizer
    from hybridflow.data.tasks.arithmetic import make_arithmetic_rows, random_wrong_answer
    from hybridflow.trainer.warmup import supervised_warmup

    create_tiny_model_dir(path, task="arithmetic", seed=seed, **MODEL_SIZES[size])
    model = load_causal_lm(path)
    tokenizer = hf_tokenizer(path)
    if lengths:
        set_stop_logits(model, tokenizer.eos_token_id, tokenizer.pad_token_id, lengths)
        print(f"mean sampled response length {sampled_length(model, tokenizer, lengths):.1f} of {lengths}")
    else:
        supervised_warmup(model, tokenizer, make_arithmetic_rows(), random_wrong_answer, steps=40, lr=3e-3, seed=seed)
    model.save_pretrained(path)


def sampled_length(model, tokenizer, budget: int, rows: int = 256) -> float:
    """Mean length (EOS included) of ``rows`` responses sampled at temperature 1 by hybridflow's decode loop."""
    from hybridflow.runtime.engines.decode import decode
    from hybridflow.runtime.engines.sampling import SamplingParams

    ids = torch.tensor([tokenizer("3+4=")["input_ids"]])
    out = decode(model, ids, torch.ones_like(ids), SamplingParams(n=rows, max_new_tokens=budget),
                 eos_token_ids=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id,
                 generator=torch.Generator().manual_seed(0))
    return float(out.response_mask.sum(1).mean())


@torch.no_grad()
def _hf_generate_decode(model, prompt_ids, prompt_mask, params, *, eos_token_ids, pad_token_id, generator=None):
    """hybridflow's ``decode`` contract, sampled by ``model.generate`` as TRL does (diagnosis variant)."""
    from transformers import GenerationConfig

    from hybridflow.runtime.engines.decode import Decoded

    ids, mask = prompt_ids.repeat_interleave(params.n, 0), prompt_mask.repeat_interleave(params.n, 0)
    config = GenerationConfig(max_new_tokens=params.max_new_tokens, do_sample=not params.greedy, top_k=0, top_p=1.0,
                              temperature=params.temperature, pad_token_id=pad_token_id, eos_token_id=list(eos_token_ids))
    out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)[:, ids.shape[1]:]
    width = params.max_new_tokens
    tokens = torch.full((len(ids), width), pad_token_id, dtype=torch.long)
    tokens[:, :out.shape[1]] = out
    is_eos = torch.isin(tokens, torch.tensor(list(eos_token_ids)))
    first = torch.where(is_eos.any(1), is_eos.int().argmax(1), torch.full((len(ids),), width))
    response_mask = (torch.arange(width)[None] <= first[:, None]).float()
    full = torch.cat([ids, tokens], 1)
    attention = torch.cat([mask, response_mask.long()], 1)
    logits = model(input_ids=full, attention_mask=attention).logits[:, ids.shape[1] - 1:-1].float() / params.temperature
    log_probs = torch.log_softmax(logits, -1).gather(-1, tokens[..., None]).squeeze(-1) * response_mask
    return Decoded(tokens, response_mask, log_probs)


def _use_trl_prompt_order(seed: int) -> None:
    """PromptLoader orders drawn like TRL's RepeatSampler: the e-th randperm of a generator seeded with ``seed``."""
    import numpy as np

    from hybridflow.data.datasets import PromptLoader

    generator, orders = torch.Generator().manual_seed(seed), []

    def trl_order(self, epoch):
        if not self.shuffle:
            return np.arange(len(self.dataset))
        while len(orders) <= epoch:
            orders.append(torch.randperm(len(self.dataset), generator=generator).numpy())
        return orders[epoch]

    PromptLoader._order = trl_order


def run(cfg: RunConfig) -> None:
    from hybridflow import PPOConfig
    from hybridflow.algorithms import GRPOTrainer

    torch.set_num_threads(cfg.threads)
    if cfg.variant.get("plain_logprobs"):
        from hybridflow.runtime.engines import lm_logprobs

        lm_logprobs.plain_lm_head = lambda model: None
    if cfg.variant.get("joined_forward"):
        from hybridflow.runtime.engines import critic, lm_logprobs

        lm_logprobs.shared_response_hidden = critic.shared_response_hidden = lambda *args, **kwargs: None
    if cfg.variant.get("sampling_skip"):
        from hybridflow.runtime.engines.rollout_hf import HFRolloutEngine

        make_generator, skip = HFRolloutEngine._generator, int(cfg.variant["sampling_skip"])

        def shifted_generator(self, seed):
            fresh = seed is not None and seed not in self._generators
            generator = make_generator(self, seed)
            if fresh:
                torch.rand(skip, generator=generator)
            return generator

        HFRolloutEngine._generator = shifted_generator
    if cfg.variant.get("trl_prompt_order"):
        _use_trl_prompt_order(cfg.seed)
    if cfg.variant.get("hf_generate"):
        from hybridflow.runtime.engines import rollout_hf

        rollout_hf.decode = _hf_generate_decode
    out = Path(cfg.out)
    rows, tokenizer = arithmetic_rows(), load_tokenizer(cfg.model_dir)
    evals: list[dict] = []
    cpu_times: list[float] = []  # process CPU time of each train_step (one thread: barely touched by other load)
    step_prompts: list[list[str]] = []  # each step's prompts, in order
    train_overrides = dict(cfg.variant.get("train", {}))
    if cfg.lr_schedule != "constant":
        train_overrides.update(lr_schedule=cfg.lr_schedule, total_steps=cfg.steps)

    from hybridflow.runtime.engines.rollout_hf import HFRolloutEngine

    generation_clock = [0.0, 0.0]  # (wall, CPU) seconds in the rollout engine's generate during the step
    engine_generate = HFRolloutEngine.generate

    def timed_generate(self, *args, **kwargs):
        """The rollout engine's generate (sampling, decoding the text) on both clocks: the record's gen_s / gen_cpu_s."""
        start, start_cpu = time.perf_counter(), time.process_time()
        try:
            return engine_generate(self, *args, **kwargs)
        finally:
            generation_clock[0] += time.perf_counter() - start
            generation_clock[1] += time.process_time() - start_cpu

    HFRolloutEngine.generate = timed_generate
    gen_times: list[tuple[float, float]] = []

    class BenchTrainer(GRPOTrainer):
        """GRPO whose validation is the shared greedy evaluation (common.greedy_accuracy)."""

        def validate(self):
            if cfg.eval_every == 0:  # no evaluation (before and after training included)
                return {}
            acc = greedy_accuracy(self.policy_model(), tokenizer, rows, cfg.max_new_tokens)
            evals.append({"step": self.step, "greedy_accuracy": acc})
            return {"val/score/greedy": acc}

        def train_step(self, rows):
            start = time.process_time()
            generation_clock[:] = [0.0, 0.0]
            metrics = super().train_step(rows)
            cpu_times.append(time.process_time() - start)
            gen_times.append(tuple(generation_clock))
            step_prompts.append([row["prompt"] for row in rows])
            return metrics

        def role_specs(self):
            specs = super().role_specs()
            for spec in specs.values():
                if spec.train is not None and train_overrides:
                    spec.train = spec.train.model_copy(update=train_overrides)
                if spec.sampling is not None and "sampling_seed" in cfg.variant:
                    seed = cfg.variant["sampling_seed"]
                    spec.sampling = spec.sampling.model_copy(update={"seed": cfg.seed if seed == "run" else int(seed)})
            return specs

    settings = dict(
        actor_model_name=cfg.model_dir, output_dir=str(out.with_suffix("")) + "_hf", seed=cfg.seed,
        num_threads=cfg.threads, rollout_batch_size=cfg.prompts, n_samples=cfg.group,
        max_response_length=cfg.max_new_tokens, temperature=cfg.temperature, actor_lr=cfg.lr, adam_betas=cfg.betas,
        weight_decay=0.0, max_grad_norm=cfg.max_grad_norm, clip_ratio=cfg.clip, loss_agg_mode="token-mean",
        kl_coef=0.0, recompute_old_log_probs=False, max_steps=cfg.steps, eval_freq=cfg.eval_every, val_samples=1,
        resume="never", trackers=("jsonl",), progress_bar=False,
    )
    settings.update(cfg.variant.get("config", {}))
    trainer = BenchTrainer(config=PPOConfig(**settings))
    start = time.perf_counter()
    history = trainer.train()
    wall = time.perf_counter() - start
    steps = [{"step": i + 1, **{name: float(m[key]) for key, name in METRICS.items() if key in m},
              "time_s": float(m.get("timing_s/step", 0.0)), "cpu_s": cpu, "gen_s": gen[0], "gen_cpu_s": gen[1],
              "prompts": prompts}
             for i, (m, cpu, gen, prompts) in enumerate(zip(history, cpu_times, gen_times, step_prompts))]
    write_record(out, framework="hybridflow", config=cfg, steps=steps, evals=evals, wall_s=wall)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", help="RunConfig JSON file")
    parser.add_argument("--make-model", metavar="DIR", help="write the seed's model folder to DIR and exit")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", choices=sorted(MODEL_SIZES), default="tiny", help="the model folder's shape")
    parser.add_argument("--lengths", type=int, default=0, help="with --make-model: > 0 makes the speed benchmark's "
                        "random-weight folder whose responses average half of this many tokens")
    args = parser.parse_args(argv)
    if not args.make_model and not args.config:
        parser.error("give a RunConfig JSON file (tools/bench_vs_trl.py writes them), or --make-model DIR")
    if args.make_model:
        torch.set_num_threads(1)
        make_model(Path(args.make_model), args.seed, args.size, args.lengths)
    else:
        run(RunConfig.load(args.config))


if __name__ == "__main__":
    main()
