"""LoRA runs end to end (lora_rank > 0): the reference shares the actor's module, checkpoints hold adapters and
their optimizer state only, resume continues the same steps, and export merges the adapters into a plain model."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("peft", reason="LoRA needs peft (pip install hybridflow[lora])")

from hybridflow.runtime.engines.base_view import BaseModelView  # noqa: E402
from hybridflow.trainer import Trainer  # noqa: E402
from run_testkit import StopAt, learned  # noqa: E402

LORA = dict(lora_rank=4, lora_alpha=8.0, actor_lr=5e-3, kl_coef=0.01)


def _ppo(fast_config, out, trackers=None, **kw):
    """PPO (a critic: advantages are non-zero from the first step, on a model that never earns a reward yet)."""
    config = fast_config(output_dir=str(out), batch_size=4, **{**LORA, **kw})
    return Trainer(config, algorithm="ppo", **({"trackers": trackers} if trackers else {}))


def test_lora_run_shares_the_base_weights_and_resumes_the_same_steps(fast_config, tmp_path):
    full_trainer = _ppo(fast_config, tmp_path / "full", max_steps=4, save_freq=2)
    full = full_trainer.train()
    (actor,), (ref,) = full_trainer.describe("actor"), full_trainer.describe("ref")
    # one copy of the base weights: the reference computes with the actor's module
    assert ref["engines"]["train"] == BaseModelView.__name__ and ref["shares_module_with"] == ["actor"]
    assert full_trainer.plan.placement("ref").pool == full_trainer.plan.placement("actor").pool
    adapters = set(actor["adapters"])
    assert adapters and set(actor["trainable"]) == adapters
    # the config reaches the plan: the compiler costs the actor with its adapters (what weight syncs send)
    assert full_trainer.run_spec.model_specs()["actor"].adapter_params == sum(actor["trainable"][n] for n in adapters)
    assert all(m["weight_sync/actor/mb"] == 0.0 for m in full if "weight_sync/actor/mb" in m)  # shared module: nothing moves

    import torch.distributed.checkpoint as dcp

    step2 = tmp_path / "full" / "checkpoints" / "step_00000002"
    stored = dcp.FileSystemReader(str(step2 / "tensors" / "actor")).read_metadata().state_dict_metadata
    assert {k[len("model/"):] for k in stored if k.startswith("model/")} == adapters  # adapters only...
    assert {k.split("/")[1] for k in stored if k.startswith("optim/")} == adapters  # ...and their Adam state
    assert (step2 / "hf" / "actor" / "adapter_config.json").is_file()

    with pytest.raises(KeyboardInterrupt):  # killed during step 3, after step 2's checkpoint
        _ppo(fast_config, tmp_path / "cut", max_steps=4, save_freq=2, trackers=[StopAt(3)]).train()
    resumed_trainer = _ppo(fast_config, tmp_path / "cut", max_steps=4, save_freq=2)
    resumed = resumed_trainer.train()
    assert resumed_trainer.resumed_from.name == "step_00000002" and len(resumed) == 2
    for step, (a, b) in enumerate(zip(full[2:], resumed), start=3):
        a, b = learned(a), learned(b)
        assert a.keys() == b.keys()
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), f"step {step}: {key}"
    assert len({m["actor/pg_loss"] for m in full}) == 4  # the run does move


def test_export_merges_the_adapters_into_a_plain_transformers_model(fast_config, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    from hybridflow.cli import main

    trainer = _ppo(fast_config, tmp_path / "run", max_steps=2, save_freq=2, actor_lr=2e-2)
    trainer.train()
    assert main(["export", str(trainer.output_dir), "--to", str(tmp_path / "hf")]) == 0
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert not any("lora" in name or "base_layer" in name for name in exported.state_dict())
    actor = trainer.policy_model()  # the trained model as its worker holds it, adapters merged (an export plan)
    ids = torch.tensor([[1, 5, 6, 7, 8], [1, 9, 4, 3, 2]])
    with torch.no_grad():
        lora_logits = actor(input_ids=ids).logits
        plain_logits = exported(input_ids=ids).logits
        base_logits = AutoModelForCausalLM.from_pretrained(trainer.actor_path)(input_ids=ids).logits
    assert torch.allclose(plain_logits, lora_logits, atol=1e-5)
    assert not torch.allclose(base_logits, lora_logits, atol=1e-4)  # the adapters did change the model
