"""Record a hybridflow GRPO run for tools/bench_trl/replay_trl.py: each step's batch, weights before it and gradient.

    python tools/bench_trl/replay_hybridflow.py RUN_CONFIG.json DUMP.pt

The gradient is the one the update clips (before clipping), so TRL's loss, evaluated on the
same batch at the same weights, can be compared with it step by step.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hybridflow_runner  # noqa: E402
from common import RunConfig  # noqa: E402

FIELDS = ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "advantages")


def main(config: str, dump: str) -> None:
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
    hybridflow_runner.run(RunConfig.load(config))
    torch.save(steps, dump)


if __name__ == "__main__":
    main(*sys.argv[1:3])
