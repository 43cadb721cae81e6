"""Record a hybridflow GRPO run for tools/bench_trl/replay_trl.py: each step's batch, weights before it and gradient.

    python tools/bench_trl/replay_hybridflow.py RUN_CONFIG.json DUMP.pt

The gradient is the one the update clips (before clipping), so TRL's loss, evaluated on the
same batch at the same weights, can be compared with it step by step.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hybridflow_runner  # noqa: E402
from common import RunConfig  # noqa: E402

FIELDS = ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "advantages")


def record(config: str, dump: str) -> None:
    """Run the RunConfig at ``config`` with the train engine's update and clipping recorded; save to ``dump``."""
    from hybridflow.runtime.engines import train

    update, clip = train.TrainEngine.update, train.TrainEngine._clip_gradients
    steps: list[dict] = []

    def recording_update(self, batch, terms, **kw):
        steps.append({**{k: batch[k].clone() for k in FIELDS},
                      "params": {n: p.detach().clone() for n, p in self.module.named_parameters()}})
        return update(self, batch, terms, **kw)

    def recording_clip(self):
        steps[-1]["grads"] = {n: torch.zeros_like(p) if p.grad is None else p.grad.detach().clone()
                              for n, p in self.module.named_parameters()}
        return clip(self)

    train.TrainEngine.update, train.TrainEngine._clip_gradients = recording_update, recording_clip
    try:
        hybridflow_runner.run(RunConfig.load(config))
    finally:
        train.TrainEngine.update, train.TrainEngine._clip_gradients = update, clip
    torch.save(steps, dump)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", help="RunConfig JSON file (tools/bench_vs_trl.py replay writes it)")
    parser.add_argument("dump", help="where to save the recorded steps (torch.save)")
    args = parser.parse_args(argv)
    record(args.config, args.dump)


if __name__ == "__main__":
    main()
