"""The CUDA paths on one GPU, in one run of a few minutes, as one table of figures.

    python tools/gpu_check.py [--size 100m] [--steps 3] [--out gpu_check.json]

Each check runs on its own; a failure is a row that says what broke (with the exception), and the
other checks still run. The exit status is 1 when a check failed, 0 otherwise; a check that cannot run
on this machine (vLLM or flash-attention not installed, one GPU for a two-GPU collective) is a
``skipped`` row that says why.

1. ``env``: torch, CUDA device, bf16 support, transformers / peft / flash-attn / vLLM versions.
2. ``train-engine``: the plain :class:`~hybridflow.runtime.engines.TrainEngine` on ``cuda:0`` under
   bf16 autocast (``precision='auto'``): an hf rollout of the bench model, the log-probs of that rollout
   (against the rollout's own, bf16 against bf16), and timed updates (PPO clip + low-variance KL):
   seconds per update, tokens/s, peak memory.
3. ``fsdp2``: the same update through :class:`~hybridflow.runtime.engines.fsdp.FSDPTrainEngine` on a
   one-rank NCCL process group and device mesh (``fully_shard`` per decoder layer, bf16 autocast), from
   the same weights: its metrics against the plain engine's, seconds per update, peak memory, and the
   full state dict gathered back (``torch.distributed.checkpoint.state_dict``) against the plain
   engine's weights after the same step.
4. ``weight-sync``: that FSDP2 actor beside an hf rollout engine with its own copy of the weights on the same
   device (``Worker.sync_weights``: full tensors gathered and copied in 256 MiB buckets): seconds, GB/s,
   the rollout's weights against the actor's (must be equal), and an offload / onload round trip of the
   role (``Worker.offload``), after which the rollout still generates and the actor still updates.
5. ``nccl``: all-reduce and broadcast of a 256 MiB bf16 tensor (the runtime's weight-sync bucket) on
   the one-rank group; a two-rank group needs two GPUs (NCCL refuses two ranks on one device).
6. ``grpo`` and ``ppo``: the trainer (``hybridflow.trainer.Trainer``, local executor) on ``cuda:0``
   with the hf rollout engine, all roles colocated: seconds per step and its parts, and peak memory. The
   hf rollout engine samples from the actor's own module there, so the weight sync moves nothing (0 MB).
7. ``packing``: where the train engine has ``pack_sequences``: packed against padded log-probs in
   float32 on CUDA (max abs difference) and the bf16 update time of each; flash-attention varlen where
   ``flash_attn`` is installed.
8. ``lora``: where the trainer has ``lora_rank``: GRPO steps with LoRA adapters (rank 16) on ``cuda:0``
   against the full fine-tune's: seconds per step and peak memory; and the sync of check 4 (an FSDP2 actor
   into its rollout copy), full weights against adapters only: megabytes and seconds.
9. ``vllm``: where vLLM is installed: GRPO steps with the vLLM rollout engine colocated with the actor
   (sleep mode on CUDA: it sleeps through the update and wakes for generation) and the weight update into it
   on the same device after every step, full weights and then LoRA adapters (as LoRA requests): seconds per
   step, sync megabytes and seconds, peak memory.

Figures are from one run on whatever else the machine is doing; ratios inside a row compare two
measurements of the same run.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import importlib.util
import json
import os
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PG = [("ppo_clip", 1.0, {"clip_low": 0.2, "clip_high": 0.28}), ("kl_loss", 0.01, {"kl_type": "low_var_kl"})]
ROWS: list[dict] = []
DEVICE = "cuda:0"
"""Where the checks run: cuda:0; ``--device cpu`` runs them on the CPU with gloo (to test this script, not to measure)."""


def on_cuda() -> bool:
    return DEVICE.startswith("cuda")


def row(check: str, status: str, **figures) -> None:
    ROWS.append({"check": check, "status": status, **figures})
    shown = ", ".join(f"{k}={v}" for k, v in figures.items())
    print(f"[{check}] {status}: {shown}", flush=True)


def run_check(name: str, fn, *args) -> None:
    reset_peak()
    start = time.perf_counter()
    try:
        fn(*args)
    except Exception as error:  # a check's failure is a row; the others still run
        traceback.print_exc()
        row(name, "FAILED", error=f"{type(error).__name__}: {str(error).splitlines()[0][:300] if str(error) else ''}")
    print(f"[{name}] {time.perf_counter() - start:.1f} s", flush=True)


def synced() -> float:
    if on_cuda():
        torch.cuda.synchronize()
    return time.perf_counter()


def reset_peak() -> None:
    gc.collect()  # an earlier check's engines, held in reference cycles, would count in the next one's peak
    if on_cuda():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_gib() -> float | None:
    """The most GPU memory torch held since the last :func:`reset_peak` (None on the CPU)."""
    return round(torch.cuda.max_memory_allocated() / 2**30, 2) if on_cuda() else None


def version(name: str) -> str:
    if importlib.util.find_spec(name) is None:
        return "absent"
    try:
        from importlib.metadata import version as dist_version

        return dist_version(name.replace("_", "-"))
    except Exception:
        return "present"


# ---------------------------------------------------------------------------------------------------- checks

def check_env(_args) -> None:
    import transformers

    versions = dict(torch=torch.__version__, transformers=transformers.__version__, peft=version("peft"),
                    flash_attn=version("flash_attn"), vllm=version("vllm"))
    if not on_cuda():
        row("env", "ok", device="cpu", **versions)
        return
    props = torch.cuda.get_device_properties(0)
    row("env", "ok", device=props.name, memory_gib=round(props.total_memory / 2**30), sm=f"{props.major}.{props.minor}",
        cuda=torch.version.cuda, bf16=torch.cuda.is_bf16_supported(), nccl=".".join(map(str, torch.cuda.nccl.version())),
        **versions)


def bench_model(size: str, seed: int = 0):
    from hybridflow.data import bench_model_shape, make_tiny_model, make_tiny_tokenizer

    tokenizer = make_tiny_tokenizer("arithmetic")
    model = make_tiny_model("qwen2", vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, seed=seed,
                            **bench_model_shape(size))
    return tokenizer, model


def rollout_batch(tokenizer, model, *, prompts: int, n: int, tokens: int):
    """An hf rollout on DEVICE with old = rollout log-probs, random advantages and a reference 0.1 below."""
    from hybridflow.data import make_prompt_batch
    from hybridflow.data.tasks.arithmetic import make_arithmetic_rows
    from hybridflow.runtime.engines import HFRolloutEngine, SamplingParams

    engine = HFRolloutEngine(model, tokenizer=tokenizer, device=DEVICE)
    params = SamplingParams(n=n, max_new_tokens=tokens, stop_at_eos=False, seed=0)
    start = synced()
    batch = engine.generate(make_prompt_batch(make_arithmetic_rows()[:prompts], tokenizer), params)
    seconds = synced() - start
    adv = torch.randn(batch["response_mask"].shape, generator=torch.Generator().manual_seed(0))
    batch = batch.with_fields(old_log_probs=batch["rollout_log_probs"], advantages=adv,
                              ref_log_probs=batch["rollout_log_probs"] - 0.1)
    return batch, seconds


def timed_updates(engine, batch, steps: int) -> tuple[list[dict], float]:
    """``steps`` updates after one untimed warm-up; (metrics of each, mean seconds of the timed ones)."""
    metrics = [engine.update(batch, PG)]
    start = synced()
    for _ in range(steps):
        metrics.append(engine.update(batch, PG))
    return metrics, (synced() - start) / max(steps, 1)


def check_train_engine(args) -> None:
    from hybridflow.runtime.engines import TrainEngine, TrainEngineConfig

    tokenizer, model = bench_model(args.size)
    batch, gen_s = rollout_batch(tokenizer, model, prompts=args.prompts, n=args.n, tokens=args.tokens)
    tokens = int(batch["response_mask"].sum())
    engine = TrainEngine(model, TrainEngineConfig(lr=1e-5, micro_batch_size=args.micro), device=DEVICE)
    assert engine.use_bf16 == on_cuda(), "precision 'auto' should turn bf16 autocast on for this GPU (off on CPU)"
    log_probs = engine.compute_log_probs(batch)
    mask = batch["response_mask"].bool()
    gap = float((log_probs - batch["rollout_log_probs"])[mask].abs().max())
    _, update_s = timed_updates(engine, batch, args.steps)
    row("train-engine", "ok", model=args.size, sequences=len(mask), gen_tokens_per_s=round(tokens / gen_s),
        logprob_vs_rollout_max_abs=round(gap, 4), update_s=round(update_s, 3),
        update_tokens_per_s=round(tokens / update_s), peak_gib=peak_gib())


@contextlib.contextmanager
def one_rank_group():
    """A one-rank default group on 127.0.0.1: NCCL for CUDA tensors and gloo for CPU ones (gloo alone on the CPU)."""
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    init = f"tcp://127.0.0.1:{port}"
    if on_cuda():
        torch.cuda.set_device(0)
        dist.init_process_group("cpu:gloo,cuda:nccl", init_method=init, rank=0, world_size=1,
                                device_id=torch.device(DEVICE))
    else:
        dist.init_process_group("gloo", init_method=init, rank=0, world_size=1)
    try:
        yield dist
    finally:
        dist.destroy_process_group()


def check_fsdp2(args) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from hybridflow.runtime.engines import TrainEngine, TrainEngineConfig
    from hybridflow.runtime.engines.fsdp import FSDPTrainEngine

    tokenizer, model = bench_model(args.size)
    batch, _ = rollout_batch(tokenizer, copy.deepcopy(model), prompts=args.prompts, n=args.n, tokens=args.tokens)
    config = TrainEngineConfig(lr=1e-5, micro_batch_size=args.micro)
    plain = TrainEngine(copy.deepcopy(model), config, device=DEVICE)
    plain_first = plain.update(batch, PG)
    plain_weights = {k: v.detach().float().cpu() for k, v in plain.module.state_dict().items()}
    del plain
    reset_peak()
    with one_rank_group():
        mesh = init_device_mesh(torch.device(DEVICE).type, (1,))
        engine = FSDPTrainEngine(model, config, mesh=mesh, device=DEVICE)
        metrics, update_s = timed_updates(engine, batch, args.steps)
        first = metrics[0]
        keys = ("actor/pg_loss", "actor/ppo_kl", "actor/grad_norm")
        diffs = {k.split("/")[1]: abs(first[k] - plain_first[k]) for k in keys if k in first and k in plain_first}
        # the weights after the first step, gathered as a full state dict, against the plain engine's
        fresh = FSDPTrainEngine(bench_model(args.size)[1], config, mesh=mesh, device=DEVICE)
        fresh.update(batch, PG)
        state = fresh.state_dict()["model"] if "model" in fresh.state_dict() else fresh.state_dict()
        worst = max(float((state[k].float().cpu() - v).abs().max()) for k, v in plain_weights.items() if k in state)
        matched = sum(k in state for k in plain_weights)
    assert matched == len(plain_weights), f"the gathered state dict holds {matched} of {len(plain_weights)} tensors"
    row("fsdp2", "ok", model=args.size, metric_vs_plain_max_abs=round(max(diffs.values()), 5),
        weights_vs_plain_max_abs=f"{worst:.2e}", update_s=round(update_s, 3), peak_gib=peak_gib())


@contextlib.contextmanager
def actor_beside_a_rollout_copy(args, lora=None):
    """An FSDP2 actor (one rank; LoRA adapters when ``lora`` is a LoraSettings) and an hf rollout engine with its
    own copy of the weights on DEVICE (a LoRA model too when the actor is), in a Worker; yields
    (worker, train engine, rollout engine, a rollout batch). The actor has taken one update."""
    from torch.distributed.device_mesh import init_device_mesh

    from hybridflow.runtime.engines import HFRolloutEngine, TrainEngineConfig
    from hybridflow.runtime.engines.fsdp import FSDPTrainEngine
    from hybridflow.runtime.engines.lora import apply_lora
    from hybridflow.runtime.roles import RoleEngines
    from hybridflow.runtime.topology import RoleSlot, Slot
    from hybridflow.runtime.worker import Worker

    tokenizer, model = bench_model(args.size)
    batch, _ = rollout_batch(tokenizer, copy.deepcopy(model), prompts=args.prompts, n=args.n, tokens=args.tokens)
    with one_rank_group():
        own = copy.deepcopy(model)
        rollout = HFRolloutEngine(apply_lora(own, lora) if lora else own, tokenizer=tokenizer, device=DEVICE)
        train = FSDPTrainEngine(model, TrainEngineConfig(lr=1e-4, micro_batch_size=args.micro, lora=lora),
                                mesh=init_device_mesh(torch.device(DEVICE).type, (1,)), device=DEVICE)
        slot = Slot(pool="gpu", rank=0, global_rank=0, device=DEVICE, roles=(RoleSlot("actor", "policy", True, True, 1),))
        worker = Worker(slot, {})
        worker.device = DEVICE
        worker.host({"actor": RoleEngines("policy", train=train, rollout=rollout)})
        train.update(batch, PG)
        yield worker, train, rollout, batch


def timed_sync(worker, train, rollout) -> tuple[object, float, float]:
    """A warm-up sync, then a timed one: (its SyncStats, seconds, the largest difference between a synced
    tensor of the rollout copy and the actor's)."""
    worker.sync_weights("actor")
    start = synced()
    stats = worker.sync_weights("actor")
    seconds = synced() - start
    copied = rollout.model.state_dict()
    gap = max(float((copied[name].float().cpu() - tensor.float().cpu()).abs().max())
              for name, tensor in train.named_weights())
    return stats, seconds, gap


def check_weight_sync(args) -> None:
    """FSDP2 actor + an hf rollout engine with its own copy on the same device: sync, offload, onload."""
    from hybridflow.runtime.engines import SamplingParams

    with actor_beside_a_rollout_copy(args) as (worker, train, rollout, batch):
        stats, sync_s, gap = timed_sync(worker, train, rollout)
        held = torch.cuda.memory_allocated() if on_cuda() else 0
        start = synced()
        worker.offload("actor", ["params", "optimizer"])
        offload_s = synced() - start
        freed = held - (torch.cuda.memory_allocated() if on_cuda() else 0)
        start = synced()
        worker.onload("actor", ["params", "optimizer"])
        onload_s = synced() - start
        again = rollout.generate(batch.select("prompt_ids", "prompt_mask"), SamplingParams(max_new_tokens=4, greedy=True))
        train.update(batch, PG)  # the optimizer still steps after the round trip
    assert stats.bytes > 0 and gap == 0.0, (stats, gap)
    assert len(again["response_ids"]) == len(batch["prompt_ids"])
    row("weight-sync", "ok", model=args.size, sync_mb=round(stats.bytes / 2**20, 2), buckets=stats.buckets,
        sync_s=round(sync_s, 4), sync_gb_per_s=round(stats.bytes / 2**30 / max(sync_s, 1e-9), 1),
        rollout_vs_train_max_abs=gap, offload_s=round(offload_s, 3), offload_freed_gib=round(freed / 2**30, 2),
        onload_s=round(onload_s, 3))


def check_nccl(_args) -> None:
    with one_rank_group() as dist:
        tensor = torch.ones(128 * 2**20 if on_cuda() else 2**20, dtype=torch.bfloat16, device=DEVICE)  # 256 MiB
        dist.all_reduce(tensor)
        dist.broadcast(tensor, src=0)
        start = synced()
        for _ in range(10):
            dist.broadcast(tensor, src=0)
        seconds = (synced() - start) / 10
        assert float(tensor[0]) == 1.0
        small = torch.arange(4.0)
        dist.all_reduce(small)  # gloo on the CPU side of the same group
    row("nccl", "ok", world=1, bucket_mib=round(tensor.numel() * 2 / 2**20), broadcast_ms=round(seconds * 1e3, 3),
        cpu_gloo_all_reduce=small.tolist() == [0.0, 1.0, 2.0, 3.0],
        note="a two-rank group needs two GPUs")


def trainer_run(args, work: Path, *, algorithm: str, **overrides) -> dict:
    """``args.steps + 1`` steps of the trainer on DEVICE; the means of the steps after the first."""
    from hybridflow import PPOConfig
    from hybridflow.data import bench_model_shape, create_tiny_model_dir
    from hybridflow.trainer import Trainer

    model_dir = work / f"model_{args.size}"
    if not (model_dir / "config.json").is_file():
        create_tiny_model_dir(model_dir, task="arithmetic", seed=0, **bench_model_shape(args.size))
    fields = dict(actor_model_name=str(model_dir), output_dir=str(work / algorithm), seed=0,
                  rollout_batch_size=args.prompts, n_samples=args.n if algorithm == "grpo" else 1,
                  max_response_length=args.tokens, actor_lr=1e-5, max_steps=args.steps + 1, eval_freq=0,
                  resume="never", overwrite=True, trackers=("jsonl",), progress_bar=False,
                  micro_batch_size=args.micro, placement="colocate")
    fields.update(overrides)
    reset_peak()
    trainer = Trainer(PPOConfig(**fields), algorithm=algorithm)
    history = trainer.train()
    plan = json.loads((work / algorithm / "plan.json").read_text())
    devices = sorted({str(d) for d in _devices_in(plan)})
    later = history[1:] or history
    mean = lambda key: round(sum(m.get(key, 0.0) for m in later) / len(later), 3)  # noqa: E731
    return {"steps": len(history), "step_s": mean("timing_s/step"), "sync_s": mean("timing_s/update_weights"),
            "sync_mb": mean("weight_sync/actor/mb"), "gen_s": mean("timing_s/gen"),
            "update_s": mean("timing_s/update_actor"), "devices": devices, "peak_gib": peak_gib()}


def _devices_in(node) -> list:
    """Every string under a 'device' or 'devices' key of the plan's JSON."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("device", "devices"):
                found.extend(value if isinstance(value, list) else [value])
            else:
                found.extend(_devices_in(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(_devices_in(item))
    return found


def check_trainer(args, algorithm: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        figures = trainer_run(args, Path(tmp), algorithm=algorithm)
    assert figures["steps"] == args.steps + 1, figures
    row(algorithm, "ok", model=args.size, **figures)


def check_packing(args) -> None:
    from hybridflow.runtime.engines import TrainEngine, TrainEngineConfig

    if "pack_sequences" not in TrainEngineConfig.model_fields:
        row("packing", "skipped", reason="this checkout's TrainEngineConfig has no pack_sequences")
        return
    tokenizer, model = bench_model(args.size)
    # a mix of lengths: responses stop at EOS, so packing has padding to remove
    from hybridflow.data import make_prompt_batch
    from hybridflow.data.tasks.arithmetic import make_arithmetic_rows
    from hybridflow.runtime.engines import HFRolloutEngine, SamplingParams

    rollout = HFRolloutEngine(model, tokenizer=tokenizer, device=DEVICE)
    batch = rollout.generate(make_prompt_batch(make_arithmetic_rows()[:args.prompts], tokenizer),
                             SamplingParams(n=args.n, max_new_tokens=args.tokens, seed=1))
    lengths = batch["response_mask"].sum(-1)
    if int(lengths.min()) == int(lengths.max()):  # a random model may never stop: cut responses to varied lengths
        cut = torch.randint(1, args.tokens + 1, (len(lengths),), generator=torch.Generator().manual_seed(0))
        keep = torch.arange(batch["response_mask"].shape[1])[None, :] < cut[:, None]
        batch = batch.with_fields(response_mask=batch["response_mask"] * keep)
    adv = torch.randn(batch["response_mask"].shape, generator=torch.Generator().manual_seed(0))
    batch = batch.with_fields(old_log_probs=batch["rollout_log_probs"], advantages=adv,
                              ref_log_probs=batch["rollout_log_probs"] - 0.1)
    figures = {}
    exact = {}
    for packed in (False, True):
        fp32 = TrainEngine(copy.deepcopy(model), TrainEngineConfig(precision="fp32", pack_sequences=packed,
                                                                   micro_batch_size=args.micro), device=DEVICE)
        exact[packed] = fp32.compute_log_probs(batch)
        del fp32
        engine = TrainEngine(copy.deepcopy(model), TrainEngineConfig(lr=1e-5, pack_sequences=packed,
                                                                     micro_batch_size=args.micro), device=DEVICE)
        reset_peak()
        _, seconds = timed_updates(engine, batch, args.steps)
        figures[f"{'packed' if packed else 'padded'}_update_s"] = round(seconds, 3)
        figures[f"{'packed' if packed else 'padded'}_peak_gib"] = peak_gib()
        del engine
        reset_peak()
    mask = batch["response_mask"].bool()
    gap = float((exact[True] - exact[False])[mask].abs().max())
    fill = float(batch["response_mask"].sum() / batch["response_mask"].numel())
    row("packing", "ok", model=args.size, fp32_logprob_packed_vs_padded_max_abs=f"{gap:.2e}", response_fill=round(fill, 2),
        flash_attn=version("flash_attn"), **figures,
        speedup=round(figures["padded_update_s"] / figures["packed_update_s"], 2))


def check_lora(args) -> None:
    from hybridflow import PPOConfig

    if "lora_rank" not in PPOConfig.model_fields:
        row("lora", "skipped", reason="this checkout's PPOConfig has no lora_rank")
        return
    from hybridflow.runtime.engines.lora import LoraSettings

    with tempfile.TemporaryDirectory() as tmp:
        full = trainer_run(args, Path(tmp), algorithm="grpo")
        lora = trainer_run(args, Path(tmp), algorithm="grpo", lora_rank=16, lora_alpha=32, actor_lr=1e-4)
    syncs = {}
    for name, settings in (("full", None), ("lora", LoraSettings(rank=16, alpha=32))):
        reset_peak()
        with actor_beside_a_rollout_copy(args, settings) as (worker, train, rollout, _):
            stats, seconds, gap = timed_sync(worker, train, rollout)
        assert stats.bytes > 0 and gap == 0.0, (name, stats, gap)
        syncs[name] = (stats.bytes / 2**20, seconds)
    row("lora", "ok", model=args.size, full_step_s=full["step_s"], lora_step_s=lora["step_s"],
        full_peak_gib=full["peak_gib"], lora_peak_gib=lora["peak_gib"],
        full_sync_mb=round(syncs["full"][0], 2), lora_sync_mb=round(syncs["lora"][0], 2),
        full_sync_s=round(syncs["full"][1], 4), lora_sync_s=round(syncs["lora"][1], 4))


def check_vllm(args) -> None:
    """GRPO steps with the vLLM rollout engine beside the actor (sleep mode on CUDA), full weights and then LoRA
    adapters synced into it after every update."""
    if importlib.util.find_spec("vllm") is None:
        row("vllm", "skipped", reason="vLLM is not installed in this Python")
        return
    options = {"sleep_mode": True, "gpu_memory_utilization": 0.3} if on_cuda() else {"kv_cache_gib": 1}
    vllm = dict(rollout_engine="vllm", rollout_engine_options={**options, "max_model_len": 256})
    with tempfile.TemporaryDirectory() as tmp:
        full = trainer_run(args, Path(tmp), algorithm="grpo", **vllm)
        lora = trainer_run(args, Path(tmp), algorithm="grpo", lora_rank=16, lora_alpha=32, actor_lr=1e-4, **vllm)
    assert full["sync_mb"] > 0 and 0 < lora["sync_mb"] < full["sync_mb"], (full, lora)
    row("vllm", "ok", model=args.size, sleep_mode=on_cuda(), full_step_s=full["step_s"], full_gen_s=full["gen_s"],
        full_sync_mb=full["sync_mb"], full_sync_s=full["sync_s"], lora_step_s=lora["step_s"],
        lora_sync_mb=lora["sync_mb"], lora_sync_s=lora["sync_s"], full_peak_gib=full["peak_gib"],
        lora_peak_gib=lora["peak_gib"])


CHECKS = {"env": check_env, "train-engine": check_train_engine, "fsdp2": check_fsdp2, "nccl": check_nccl,
          "weight-sync": check_weight_sync,
          "grpo": lambda a: check_trainer(a, "grpo"), "ppo": lambda a: check_trainer(a, "ppo"),
          "packing": check_packing, "lora": check_lora, "vllm": check_vllm}


def print_table() -> None:
    print("\n| check | status | figures |\n|---|---|---|")
    for r in ROWS:
        figures = "; ".join(f"{k} {v}" for k, v in r.items() if k not in ("check", "status"))
        print(f"| {r['check']} | {r['status']} | {figures} |")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="100m", help="bench model (hybridflow.data.tiny.BENCH_MODELS)")
    p.add_argument("--steps", type=int, default=3, help="timed updates / trainer steps after the first")
    p.add_argument("--prompts", type=int, default=32, help="prompts per rollout")
    p.add_argument("--n", type=int, default=8, help="responses per prompt")
    p.add_argument("--tokens", type=int, default=64, help="response length")
    p.add_argument("--micro", type=int, default=64, help="micro-batch size of the updates")
    p.add_argument("--only", nargs="+", choices=sorted(CHECKS), help="run these checks only")
    p.add_argument("--out", help="write the rows as JSON here")
    p.add_argument("--device", default="cuda:0", choices=("cuda:0", "cpu"),
                   help="cpu: run the same checks on the CPU with gloo (tests this script; the figures mean nothing)")
    args = p.parse_args(argv)
    global DEVICE
    DEVICE = args.device
    ROWS.clear()
    if on_cuda() and not torch.cuda.is_available():
        print("gpu_check: no CUDA device is visible to this torch "
              f"({torch.__version__}, built with CUDA {torch.version.cuda}); run it on a machine with a GPU")
        return 2
    os.environ.setdefault("HYBRIDFLOW_CACHE", tempfile.mkdtemp(prefix="hybridflow-gpu-check-"))
    for name in args.only or list(CHECKS):
        run_check(name, CHECKS[name], args)
    print_table()
    if args.out:
        Path(args.out).write_text(json.dumps(ROWS, indent=1))
    return 1 if any(r["status"] == "FAILED" for r in ROWS) else 0


if __name__ == "__main__":
    sys.exit(main())
