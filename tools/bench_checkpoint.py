"""Benchmark: checkpoints written by the workers (dp=2, one DCP shard each) against the driver gathering the state.

    .venv/bin/python tools/bench_checkpoint.py                 # ~10M-parameter qwen2, 3 rounds
    .venv/bin/python tools/bench_checkpoint.py --layers 2      # smaller, quicker

A local Ray instance, a GRPO plan whose actor trains on a pool of two CPU slots (FSDP2, dp=2),
one training step (so AdamW has its state), then, per round:

* **sharded write / read**: the checkpoint and restore plans of the training plan
  (:func:`~hybridflow.compiler.control.control_plan` ``save_state``: every slot writes its DCP shard
  of the model and optimizer state to a folder; ``load_state``: every slot reads its part back, then
  the rollout copy is synced to it);
* **gathered**: the old path, the whole state fetched to the driver (an ``export`` plan with the
  optimizer), then one ``torch.save`` of it and one ``torch.load`` (the baseline the issue names: a
  single file of the same state).

The driver's resident memory is sampled every 2 ms during each write (``/proc/self/status``); its
largest rise over the value before is set against the state's size (parameters + AdamW's two
moments, fp32). The sharded read includes loading into the engines (``set_state_dict``); the
torch.load baseline only reads the file into the driver.
The figures are ratios measured in the same run; seconds on a shared machine are noisy.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path


class PeakRSS:
    """The peak of this process's resident set size while the ``with`` block runs, above its value at entry (bytes)."""

    def __enter__(self) -> "PeakRSS":
        self.base = self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss())
            time.sleep(0.002)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())
        self.rise = self.peak - self.base


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def setup(args, work: Path):
    """The model folder (made in ``work``), the plan (a GRPO actor on a pool of two CPU slots: FSDP2, dp=2)
    and the role specs, for ``args.hidden`` / ``args.layers``; nothing here needs Ray."""
    from hybridflow.algorithms import ALGORITHMS
    from hybridflow.compiler import Machine, compile_for
    from hybridflow.compiler.passes import BatchShape
    from hybridflow.compiler.passes.lower import parse_model
    from hybridflow.data import create_tiny_model_dir, load_tokenizer
    from hybridflow.runtime.engines import SamplingParams, TrainEngineConfig
    from hybridflow.runtime.roles import RoleSpec
    from hybridflow_ops.rewards.arithmetic import compute_score

    model_dir = create_tiny_model_dir(work / "model", seed=0, hidden=args.hidden, layers=args.layers, heads=4, kv_heads=2)
    tokenizer = load_tokenizer(model_dir)
    graph = ALGORITHMS["grpo"].build(kl_loss=False, n=2)
    plan = compile_for(graph, {"actor": parse_model(str(model_dir))}, machine=Machine("cpu", 2, threads_per_slot=1, where="ray"),
                       placement="actor@2", batch=BatchShape(prompts=4, prompt_len=8, response_len=3, mini_batches=1))
    specs = {"actor": RoleSpec(model=str(model_dir), tokenizer=tokenizer, sampling=SamplingParams(max_new_tokens=3, seed=0),
                               train=TrainEngineConfig(lr=1e-3, precision="fp32", num_threads=1)),
             "reward": RoleSpec(reward=compute_score, tokenizer=tokenizer)}
    return plan, specs


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory(prefix="bench-checkpoint-") as work:
        measure(args, Path(work))


def measure(args, work: Path) -> None:
    """Set up in ``work``, train one step on Ray, then time ``args.rounds`` rounds of each path and print the figures."""
    import ray
    import torch

    from hybridflow.data import make_prompt_batch
    from hybridflow.data.tasks.arithmetic import make_arithmetic_rows
    from hybridflow.compiler.control import control_plan
    from hybridflow.runtime.ray import RayExecutor

    plan, specs = setup(args, work)
    tokenizer = specs["actor"].tokenizer
    ray.init(address="local", num_cpus=3, include_dashboard=False, log_to_driver=False)
    executor = RayExecutor(plan, specs)
    save, load = control_plan(plan, "save_state", ["actor"]), control_plan(plan, "load_state", ["actor"])
    export = control_plan(plan, "export", ["actor"], items=("optimizer",))
    try:
        executor.run_iteration({"prompts": make_prompt_batch(make_arithmetic_rows()[:4], tokenizer)})
        sharded_w, sharded_r, gathered_w, gathered_r, rss_sharded, rss_gathered, save_only = [], [], [], [], [], [], []
        state_bytes = 0
        for round_ in range(args.rounds):
            folder = work / f"round{round_}"
            with PeakRSS() as rss:
                start = time.perf_counter()
                saved = executor.run_plan(save, args={"actor.save_state": str(folder / "tensors")}).results
                sharded_w.append(time.perf_counter() - start)
            rss_sharded.append(rss.rise)
            engines = saved["actor.save_state"][0]["engines"]  # the JSON part (rank 0's), for the load
            start = time.perf_counter()
            executor.run_plan(load, args={"actor.load_state": {"folder": str(folder / "tensors"), "engines": engines}})
            sharded_r.append(time.perf_counter() - start)

            with PeakRSS() as rss:
                start = time.perf_counter()
                state = executor.run_plan(export).results["actor.export"][0]["train_state"]
                fetched = time.perf_counter()
                torch.save(state, folder / "gathered.pt")
                gathered_w.append(time.perf_counter() - start)
                save_only.append(time.perf_counter() - fetched)
            rss_gathered.append(rss.rise)
            state_bytes = sum(t.numel() * t.element_size() for t in state["model"].values()) + sum(
                v.numel() * v.element_size() for entry in state["optimizer"]["state"].values() for v in entry.values())
            del state
            start = time.perf_counter()
            torch.load(folder / "gathered.pt", weights_only=True)
            gathered_r.append(time.perf_counter() - start)
        params = sum(t.numel() for t in executor.run_plan(export).results["actor.export"][0]["model"].values())
    finally:
        executor.shutdown()
        ray.shutdown()
    med = statistics.median
    mb = 1 / 2**20
    # the driver's RSS does not shrink after a gathered state is freed: the first round's rise is the one to read
    print(f"model: {params / 1e6:.2f} M parameters; state (weights + AdamW moments, fp32): {state_bytes * mb:.1f} MiB")
    print(f"sharded (dp=2, workers write): write {med(sharded_w):.3f} s, read {med(sharded_r):.3f} s; "
          f"driver RSS rise {max(rss_sharded) * mb:.1f} MiB ({max(rss_sharded) / state_bytes:.1%} of the state)")
    print(f"gathered to the driver:        fetch + torch.save {med(gathered_w):.3f} s (torch.save alone "
          f"{med(save_only):.3f} s), torch.load {med(gathered_r):.3f} s; driver RSS rise {max(rss_gathered) * mb:.1f} MiB "
          f"({max(rss_gathered) / state_bytes:.1%} of the state)")
    print(f"ratios: sharded write / torch.save {med(sharded_w) / med(save_only):.2f}, sharded write / (fetch + save) "
          f"{med(sharded_w) / med(gathered_w):.2f}, sharded read / torch.load {med(sharded_r) / med(gathered_r):.2f}")


if __name__ == "__main__":
    main()
