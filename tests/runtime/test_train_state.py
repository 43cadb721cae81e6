"""Train engine state written and read by the processes that hold it (hybridflow.runtime.train_state).

* one process, no process group: save after an AdamW step, load into a fresh engine -> the same weights,
  moments, step, learning-rate schedule and shuffle generator; a checkpoint of another model is refused;
* two processes (gloo, FSDP2 over dp=2): each writes its shard; one process without a group loads the folder
  into a plain engine (DCP reshards) and gets exactly the full state that FSDP gathers on rank 0.
"""
from __future__ import annotations

import json

import pytest
import torch
import torch.multiprocessing as mp

from hybridflow.data import make_tiny_model
from hybridflow.errors import CheckpointError
from hybridflow.runtime.engines import TrainEngine, TrainEngineConfig
from hybridflow.runtime.train_state import load_train_state, save_train_state

CONFIG = TrainEngineConfig(lr=1e-2, precision="fp32", lr_schedule="linear", total_steps=10, warmup_steps=2)


def tiny(layers: int = 2) -> torch.nn.Module:
    return make_tiny_model("qwen2", vocab_size=16, hidden=16, layers=layers, heads=2, kv_heads=1, seed=0)


def _step(engine: TrainEngine, scale: float) -> None:
    """One AdamW step with gradients ``scale * (index + 1)`` per parameter (any tensor type: DTensor shards too)."""
    for index, param in enumerate(engine.module.parameters()):
        param.grad = torch.full_like(param, scale * (index + 1))
    engine.optimizer.step()
    engine.scheduler.advance()
    engine.optimizer.zero_grad(set_to_none=True)


def _by_name(engine: TrainEngine) -> tuple[dict, dict]:
    """Full model state and optimizer state keyed by parameter name, of a plain engine."""
    state = engine.state_dict()
    names = [name for name, _ in engine.module.named_parameters()]
    return state["model"], {names[i]: entry for i, entry in state["optimizer"]["state"].items()}


def _assert_same(model_a, optim_a, model_b, optim_b) -> None:
    assert model_a.keys() == model_b.keys() and optim_a.keys() == optim_b.keys()
    for name in model_a:
        assert torch.equal(model_a[name], model_b[name]), name
    for name in optim_a:
        for key in optim_a[name]:
            assert torch.equal(optim_a[name][key], optim_b[name][key]), (name, key)


def test_round_trip_on_one_process(tmp_path):
    source = TrainEngine(tiny(), CONFIG)
    _step(source, 0.1)
    _step(source, -0.3)
    torch.randperm(5, generator=source.shuffle_generator)  # move the shuffle generator
    saved = json.loads(json.dumps(save_train_state(source, tmp_path / "actor", role="actor")))  # as in trainer_state.json
    target = TrainEngine(tiny(), CONFIG)  # the same initial weights, no optimizer state yet
    load_train_state(target, tmp_path / "actor", saved, role="actor")
    _assert_same(*_by_name(source), *_by_name(target))
    assert target.lr == pytest.approx(source.lr) and target.scheduler.training_step == 2
    assert torch.equal(target.shuffle_generator.get_state(), source.shuffle_generator.get_state())
    _step(source, 0.2)
    _step(target, 0.2)  # and they go on alike
    _assert_same(*_by_name(source), *_by_name(target))


def test_a_checkpoint_of_another_model_is_refused(tmp_path):
    source = TrainEngine(tiny(layers=2), CONFIG)
    _step(source, 0.1)
    saved = save_train_state(source, tmp_path / "actor", role="actor")
    with pytest.raises(CheckpointError, match="role 'actor': the checkpoint does not fit this model"):
        load_train_state(TrainEngine(tiny(layers=3), CONFIG), tmp_path / "actor", saved, role="actor")


def _dp2_rank(rank: int, init: str, folder: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    from hybridflow.runtime.engines.fsdp import FSDPTrainEngine

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        engine = FSDPTrainEngine(tiny(), CONFIG, mesh=DeviceMesh.from_group(dist.group.WORLD, "cpu"), device="cpu")
        _step(engine, 0.1)
        _step(engine, -0.3)
        saved = save_train_state(engine, f"{folder}/actor", role="actor", group=dist.group.WORLD)
        full = engine.state_dict()  # gathered on rank 0: what a dp=1 engine must end up holding
        if rank == 0:
            names = engine.param_names()
            torch.save({"model": full["model"], "optim": {names[i]: e for i, e in full["optimizer"]["state"].items()}},
                       f"{folder}/full.pt")
            with open(f"{folder}/saved.json", "w") as f:
                json.dump(saved, f)
        # both ranks leave together: a rank that tore its group down while the other was still writing or
        # gathering ended in gloo's "terminate called without an active exception" (SIGABRT) on a loaded machine
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.e2e
def test_a_dp2_fsdp_checkpoint_loads_into_one_plain_engine(tmp_path):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.start_processes(_dp2_rank, args=(f"tcp://127.0.0.1:{port}", str(tmp_path)), nprocs=2, start_method="spawn")
    assert sorted(p.name for p in (tmp_path / "actor").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    full = torch.load(tmp_path / "full.pt", weights_only=True)
    saved = json.loads((tmp_path / "saved.json").read_text())
    engine = TrainEngine(tiny(), CONFIG)
    load_train_state(engine, tmp_path / "actor", saved, role="actor")  # no process group: the shards resharded
    _assert_same(full["model"], full["optim"], *_by_name(engine))
    assert engine.scheduler.training_step == 2


def test_a_lora_engine_saves_and_loads_its_adapters_and_their_optimizer_state_only(tmp_path):
    pytest.importorskip("peft")
    from hybridflow.runtime.engines.lora import LoraSettings, adapter_names

    config = CONFIG.model_copy(update={"lora": LoraSettings(rank=2)})
    source = TrainEngine(tiny(), config)
    _step(source, 0.1)
    _step(source, -0.3)
    saved = json.loads(json.dumps(save_train_state(source, tmp_path / "actor", role="actor")))
    import torch.distributed.checkpoint as dcp

    stored = set(dcp.FileSystemReader(str(tmp_path / "actor")).read_metadata().state_dict_metadata)
    adapters = adapter_names(source.module)
    assert {k[len("model/"):] for k in stored if k.startswith("model/")} == adapters
    assert {k.split("/")[1] for k in stored if k.startswith("optim/")} == adapters
    target = TrainEngine(tiny(), config)
    load_train_state(target, tmp_path / "actor", saved, role="actor")
    _assert_same(*_by_name(source), *_by_name(target))
    _step(source, 0.2)
    _step(target, 0.2)
    _assert_same(*_by_name(source), *_by_name(target))
    with pytest.raises(CheckpointError, match="does not fit"):  # a full fine-tune cannot load the adapters
        load_train_state(TrainEngine(tiny(), CONFIG), tmp_path / "actor", saved, role="actor")
