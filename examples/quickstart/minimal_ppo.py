"""Minimal PPO: the seed article's examples/quickstart, on CPU with a tiny model, in a few minutes.

No model or dataset is named, so hybridflow uses its built-in task: a tiny random-weight
model (made in code) learns `a+b=` for a, b in 0..9, reward 1 for the exact sum followed
by EOS. Actor, critic, reference and the rule reward all run on this machine; metrics go to
runs/minimal_ppo/metrics.jsonl and TensorBoard, and the last step is checkpointed.

    python examples/quickstart/minimal_ppo.py [--steps 200]
    hybridflow export runs/minimal_ppo --to runs/minimal_ppo/hf_model     # a transformers folder
"""
import argparse
import sys

from hybridflow import PPOConfig, RolloutManager
from hybridflow.trainer import PPOTrainer
from hybridflow.trainer.run_command import report_errors, stopped_status

report_errors("minimal_ppo.py")  # a hybridflow error (a full disk, a bad setting) prints one line, not a traceback
parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int, default=400, help="training steps (32 prompts x 16 samples each)")
parser.add_argument("--max-time", type=float, default=600, help="stop after this many seconds of training")
args = parser.parse_args()

# 1. the config: 32 prompts x 16 samples a step, 4 PPO mini-batches of 128 responses, large LRs for a tiny model
config = PPOConfig(
    max_steps=args.steps,
    max_time_s=args.max_time,
    num_threads=1,  # one thread is fastest for a tiny model, and steady on a busy machine
    rollout_batch_size=32,
    n_samples=16,
    batch_size=128,  # 4 optimizer steps per step on the 512 responses: without them some seeds stall near chance
    max_response_length=3,  # the longest answer, "18", is two tokens, plus EOS
    actor_lr=2e-3,
    actor_lr_schedule={"name": "cosine", "min_lr_ratio": 0.05},  # decays to 5% of 2e-3 over max_steps
    critic_lr=1e-2,
    adam_betas=(0.9, 0.9999),
    entropy_coef=0.02,  # an entropy bonus slows the collapse onto one answer
    kl_in_reward=False,  # the KL to the reference as a loss term, as GRPO has it ...
    kl_coef=0.1,
    kl_type="low_var_kl",  # ... with the low-variance (k3) estimator
    eval_freq=20,  # greedy accuracy and mean@4 on the 100 prompts every 20 steps
    stop_at_val_score=0.9,
    save_freq=args.steps,
    output_dir="runs/minimal_ppo",
    resume="never", overwrite=True,
)

# 2. the trainer: PPO's graph (generate, log-probs, ref log-probs, values, reward, GAE, two updates), planned
#    onto this machine and run by the local executor
trainer = PPOTrainer(config=config)

# 3. train (Ctrl-C or SIGTERM: the step under way is finished and checkpointed, then the script exits 130 / 143)
trainer.train()
if trainer.stop_signal:
    sys.exit(stopped_status(trainer, command="minimal_ppo.py", hint=None))

# what the policy answers now
print("\n step  greedy accuracy on the 100 prompts")
for step, metrics in sorted(trainer.validations.items()):
    accuracy = metrics["val/score/greedy"]
    print(f"{step:5d}  {accuracy:.2f} {'#' * round(40 * accuracy)}")
before, after = trainer.validations[0], trainer.validations[trainer.step]
print(f"greedy accuracy {before['val/score/greedy']:.2f} -> {after['val/score/greedy']:.2f}")
answers = RolloutManager(trainer.policy_model(), trainer.tokenizer).generate(
    ["2+3=", "4+4=", "9+9="], greedy=True, max_new_tokens=3)
print("answers:", answers)
