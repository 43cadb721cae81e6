"""Resume loses and replays nothing (#33 item 6), on-policy (staleness 0, the local executor): a run SIGKILLed
mid-run and resumed trains step by step on exactly the prompts an uninterrupted run trains on.
The staleness 1 and 4 cases run on Ray: tests/runtime/ray/test_async_resume.py."""
from __future__ import annotations

from resume_kit import killed_and_resumed, uninterrupted


def test_a_sigkilled_run_resumed_trains_on_the_prompts_of_an_uninterrupted_run(tiny_model_dir, tmp_path):
    settings = dict(actor_model_name=tiny_model_dir, algorithm="grpo", n_samples=2)
    resumed, steps = killed_and_resumed(tmp_path / "killed", settings, extra_steps=3)
    reference = uninterrupted(tmp_path / "reference", settings, steps)
    assert sorted(reference) == list(range(1, steps + 1))
    assert resumed == reference
