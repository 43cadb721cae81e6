"""Resume loses and replays nothing with staleness k = 1 and 4 (#33 item 6), on the shared Ray instance.

A ``hybridflow run`` subprocess joins the suite's Ray instance (``ray_address``), generates up to k steps
ahead on a rollout pool of its own, is SIGKILLed once its first checkpoint exists and is resumed (in this
process, on the same instance): the prompts of the generations in flight are drawn again (the checkpoint holds
the loader's position before them), so step by step it trains on the prompts an uninterrupted run trains on (an
on-policy local run: the order of the data does not depend on k).
"""
from __future__ import annotations

import pytest
from resume_kit import killed_at_first_checkpoint, resumed, uninterrupted


@pytest.mark.e2e
def test_sigkilled_async_runs_resume_on_the_prompts_of_an_uninterrupted_run(ray_address, tiny_model_dir, tmp_path):
    common = dict(actor_model_name=tiny_model_dir, algorithm="grpo_is", n_samples=2)
    settings = {k: dict(common, executor="ray", ray_address=ray_address, placement="actor@1;actor.generate@1",
                        staleness=k) for k in (1, 4)}
    # both kills first: a subprocess needs the CPUs that the resumes' parked slots hold; the second resume takes the
    # slots the first one parked (same pool shapes)
    killed_at = {k: killed_at_first_checkpoint(tmp_path / f"k{k}", settings[k]) for k in settings}
    logs = {k: (resumed(tmp_path / f"k{k}", settings[k], killed_at[k] + k + 2), killed_at[k] + k + 2) for k in settings}
    steps = max(n for _, n in logs.values())
    reference = uninterrupted(tmp_path / "reference", common, steps)
    assert sorted(reference) == list(range(1, steps + 1))
    for k, (log, n) in logs.items():
        assert log == {s: reference[s] for s in range(1, n + 1)}, k
