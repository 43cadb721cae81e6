"""check_determinism=N: the first N steps run twice before the run; bit-identical runs say so and leave nothing
behind, runs that part are named at their first step and edge, and their folders kept for hybridflow diff."""
from __future__ import annotations

import itertools

import torch

import hybridflow as hf
from hybridflow.trainer import Trainer

_calls = itertools.count()


@hf.register_op("alternating_sum", inputs=("scores: float32[B]", "old_log_probs: float32[B, R]"),
                outputs=("scores: float32[B]",))
def alternating_sum(scores, old_log_probs):
    """s_i + (sum_t l_it + C - C), C = 2^20, added left to right on even calls and right to left on odd ones: a
    computation whose float order depends on something the seed does not fix (here, how often it was called
    before). Left to right the sum is rounded to 1/8, right to left it is kept: the bits differ. (b,), (b, r) -> (b,)."""
    terms = list(old_log_probs.unbind(-1)) + [torch.full_like(scores, 2.0**20), torch.full_like(scores, -2.0**20)]
    total = torch.zeros_like(scores)
    for term in terms if next(_calls) % 2 == 0 else reversed(terms):
        total = total + term
    return scores + total


@hf.algorithm(roles={"reward": "rule"})
def alternating_grpo(prompts, actor, reward, *, n=2):
    rollout = actor.generate(prompts, n=n)
    old_logp = actor.logprob(rollout)
    scores = hf.compute("alternating_sum", reward.score(rollout), old_logp)
    actor.update(rollout, hf.compute("grpo_advantage", rollout, scores), old_logp, loss="ppo_clip")


def test_a_deterministic_run_is_bit_identical_and_proceeds(fast_config):
    trainer = Trainer(fast_config(max_steps=2, rollout_batch_size=4, check_determinism=2, calibrate=False))
    history = trainer.train()
    assert trainer.determinism.startswith("bit-identical: the first 2 step(s) computed the same")
    assert (trainer.output_dir / "determinism.txt").read_text() == trainer.determinism + "\n"
    assert not (trainer.output_dir / "determinism").exists()  # nothing to compare: the twins are gone
    assert len(history) == 2 and trainer.step == 2  # then the run itself


def test_a_run_that_parts_names_the_step_and_edge_and_keeps_both_folders(fast_config):
    trainer = Trainer(fast_config(max_steps=1, rollout_batch_size=4, check_determinism=1, calibrate=False),
                      algorithm=alternating_grpo)
    trainer.train()
    root = trainer.output_dir / "determinism"
    assert trainer.determinism.startswith("not deterministic: the two runs of the first 1 step(s) first differ at "
                                          "step 1, `alternating_sum.scores` (controller)")
    assert f"hybridflow diff {root / 'a'} {root / 'b'}" in trainer.determinism
    assert (root / "a" / "hashes.jsonl").is_file() and (root / "b" / "hashes.jsonl").is_file()
    assert trainer.step == 1 and not (trainer.output_dir / "hashes.jsonl").exists()  # the run: record_hashes off
