"""The prompts drawn ahead for staleness k, the loader position a checkpoint saves, and the prompt log."""
from __future__ import annotations

from hybridflow.data import PromptLoader
from hybridflow.trainer.prompt_log import PromptLog, read_prompt_log
from hybridflow.trainer.prompt_queue import PromptQueue

ROWS = [{"prompt": f"{i}+0=", "ground_truth": str(i)} for i in range(10)]


def _queue(seed: int = 3) -> PromptQueue:
    return PromptQueue(PromptLoader(ROWS, 2, seed=seed), make_batch=lambda rows: [r["prompt"] for r in rows])


def _steps(queue: PromptQueue, k: int, count: int) -> list[tuple[int, ...]]:
    """Run ``count`` steps as the trainer does (take the next prompts, draw up to k ahead); each step's indices."""
    seen = []
    for _ in range(count):
        drawn = queue.next()
        assert queue.start_step(drawn.rows) is drawn
        queue.fill(k)
        seen.append(drawn.indices)
    return seen


def test_prompts_drawn_ahead_keep_the_loader_order_for_every_k():
    # 10 rows, 2 a step: 5 steps an epoch, reshuffled each epoch; 7 steps cross an epoch
    orders = {k: _steps(_queue(), k, 7) for k in (0, 1, 2, 4)}
    assert orders[1] == orders[0] and orders[2] == orders[0] and orders[4] == orders[0]
    assert sorted(i for step in orders[0][:5] for i in step) == list(range(10))


def test_a_checkpoint_s_loader_state_is_the_one_before_the_prompts_drawn_ahead():
    for k in (0, 1, 4):
        queue = _queue()
        first = _steps(queue, k, 3)
        assert len(queue.ahead) == k
        saved = queue.loader_state()  # what a checkpoint after step 3 holds
        uninterrupted = first + _steps(queue, k, 5)
        resumed = _queue()
        resumed.loader.load_state_dict(saved)
        assert first + _steps(resumed, k, 5) == uninterrupted, k  # nothing lost, nothing trained twice


def test_clear_forgets_the_prompts_drawn_ahead():
    queue = _queue()
    _steps(queue, 2, 1)
    assert len(queue.ahead) == 2
    queue.clear()
    assert not queue.ahead and queue.current is None


def test_the_prompt_log_is_rewound_to_the_resumed_step(tmp_path):
    log = PromptLog(tmp_path)
    for step in (1, 2, 3):
        log.record(step, [step, step + 10])
    PromptLog(tmp_path, resume_step=2).record(3, [7, 8])  # the resumed run trains step 3 again
    assert read_prompt_log(tmp_path / "prompts.jsonl") == {1: [1, 11], 2: [2, 12], 3: [7, 8]}
    assert len((tmp_path / "prompts.jsonl").read_text().splitlines()) == 3  # each step once
    PromptLog(tmp_path)  # a fresh start empties it
    assert read_prompt_log(tmp_path / "prompts.jsonl") == {}
