"""TRL's GRPO loss and update on hybridflow's recorded batches (tools/bench_trl/replay_hybridflow.py).

    .venv-trl/bin/python tools/bench_trl/replay_trl.py RUN_CONFIG.json DUMP.pt OUT.json

Two checks, printed and written to OUT.json:

- gradient: at every recorded step, TRL's ``_compute_loss`` on hybridflow's batch at
  hybridflow's weights, back-propagated; relative difference to hybridflow's gradient;
- trajectory: TRL's own optimizer and schedule (``create_optimizer_and_scheduler``),
  ``training_step`` and clipping, fed the recorded batches one after the other from the
  step-0 weights; relative difference of its weights to hybridflow's after each step;
- sensitivity (the yardstick for the trajectory): the same TRL trajectory again from the
  step-0 weights times ``1 + PERTURBATION * noise``; relative difference of its weights to
  the unperturbed TRL trajectory after each step. Where this grows as fast as the
  trajectory difference, the two frameworks' weights part by float noise amplified by the
  updates, not by a difference in what they compute.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RunConfig, arithmetic_rows, load_tokenizer  # noqa: E402
from trl_runner import grpo_args  # noqa: E402

PERTURBATION = 1e-6
"""Relative size of the sensitivity check's perturbation of the step-0 weights (float32 noise is ~1e-7)."""


def _inputs(step: dict) -> tuple[dict, torch.Tensor]:
    mask = step["response_mask"].long()
    items = mask.sum().float()
    return {"prompt_ids": step["prompt_ids"], "prompt_mask": step["prompt_mask"], "completion_ids": step["response_ids"],
            "completion_mask": mask, "advantages": step["advantages"][:, 0], "num_items_in_batch": items}, items


def _relative(a: dict, b: dict) -> float:
    num = sum(float(((a[n] - b[n]) ** 2).sum()) for n in b) ** 0.5
    den = sum(float((b[n] ** 2).sum()) for n in b) ** 0.5
    return num / den if den else 0.0


def _trl_trajectory(trainer, model, steps: list[dict], start: dict, reference: list[dict], max_grad_norm: float):
    """TRL's optimizer, training_step and clipping on the recorded batches from weights ``start``.

    Returns the relative difference of the weights after each step (but the last) to
    ``reference[i]``, and the weights themselves.
    """
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(start[n])
    trainer.optimizer, trainer.lr_scheduler = None, None
    trainer.create_optimizer_and_scheduler(num_training_steps=len(steps))
    differences, weights = [], []
    for i, step in enumerate(steps):
        trainer.optimizer.zero_grad()
        inputs, items = _inputs(step)
        trainer.training_step(model, inputs, items)
        trainer.accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
        if i + 1 < len(steps):
            weights.append({n: p.detach().clone() for n, p in model.named_parameters()})
            differences.append(_relative(weights[-1], reference[i]))
    return differences, weights


def replay(config: str, dump: str, out: str) -> None:
    """Both checks on the steps recorded in ``dump`` (RunConfig at ``config``); printed and written to ``out``."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOTrainer

    cfg, steps = RunConfig.load(config), torch.load(dump)
    torch.set_num_threads(cfg.threads)
    model = AutoModelForCausalLM.from_pretrained(cfg.model_dir, dtype=torch.float32)
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions),
                          args=grpo_args(cfg, str(Path(out).with_suffix("")) + "_trl"),
                          train_dataset=Dataset.from_list(arithmetic_rows()), processing_class=load_tokenizer(cfg.model_dir))
    trainer.current_gradient_accumulation_steps = 1
    model.train()
    gradient = []
    for step in steps:
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(step["params"][n])
        model.zero_grad()
        trainer._compute_loss(model, _inputs(step)[0]).backward()
        gradient.append(_relative({n: p.grad for n, p in model.named_parameters()}, step["grads"]))
    trainer._prepare_inputs = lambda batch: batch  # the recorded batch, no generation
    reference = [step["params"] for step in steps[1:]]
    trajectory, trl_weights = _trl_trajectory(trainer, model, steps, steps[0]["params"], reference, cfg.max_grad_norm)
    noise = torch.Generator().manual_seed(0)
    perturbed = {n: w * (1 + PERTURBATION * torch.randn(w.shape, generator=noise)) for n, w in steps[0]["params"].items()}
    sensitivity, _ = _trl_trajectory(trainer, model, steps, perturbed, trl_weights, cfg.max_grad_norm)
    print("step  |g_trl - g_hf|/|g_hf|  |w_trl - w_hf|/|w_hf|  |w_trl' - w_trl|/|w_trl| (w_trl': from weights "
          f"perturbed by {PERTURBATION:g})")
    for i, g in enumerate(gradient):
        w = trajectory[i] if i < len(trajectory) else float("nan")
        d = sensitivity[i] if i < len(sensitivity) else float("nan")
        print(f"{i + 1:4d}  {g:20.2e}  {w:20.2e}  {d:20.2e}")
    print(f"largest gradient difference {max(gradient):.2e}")
    Path(out).write_text(json.dumps({"gradient": gradient, "trajectory": trajectory, "sensitivity": sensitivity,
                                     "perturbation": PERTURBATION}, indent=1))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", help="RunConfig JSON file of the recorded run")
    parser.add_argument("dump", help="the steps tools/bench_trl/replay_hybridflow.py recorded")
    parser.add_argument("out", help="JSON file of the differences")
    args = parser.parse_args(argv)
    replay(args.config, args.dump, args.out)


if __name__ == "__main__":
    main()
