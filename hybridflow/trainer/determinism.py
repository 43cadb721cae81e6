"""``check_determinism=N``: run the first N steps twice and say whether they computed the same values.

Two fresh trainers of the run's algorithm and config (same seed, ``record_hashes`` on, no checkpoints, no trackers)
train N steps each in ``output_dir/determinism/a`` and ``.../b``; their value hashes (:mod:`.run_record`) are
compared with :func:`~.run_diff.first_divergence`. The verdict, "bit-identical over N steps" or the first step and
edge that differ, is logged and written to ``output_dir/determinism.txt``; the run then proceeds as configured
(the check is a preamble, not a different run). The two folders are deleted when the runs agree and kept when they
differ, for ``hybridflow diff output_dir/determinism/a output_dir/determinism/b``.
"""
from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from ..errors import WriteError

__all__ = ["check_determinism", "determinism_verdict"]

log = logging.getLogger("hybridflow.trainer")


def determinism_verdict(folder_a: Path, folder_b: Path, steps: int) -> tuple[str, bool]:
    """(the verdict's text, whether the two runs agree) from the value hashes of two runs of ``steps`` steps."""
    from .run_diff import first_divergence
    from .run_folder import read_hashes

    a, b = read_hashes(folder_a), read_hashes(folder_b)
    divergence = first_divergence(a, b)
    if divergence is not None:
        return (f"not deterministic: the two runs of the first {steps} step(s) first differ at {divergence} "
                f"(compare them: hybridflow diff {folder_a} {folder_b})"), False
    if {r.step for r in a} != {r.step for r in b}:
        return f"not comparable: the runs recorded steps {sorted({r.step for r in a})} and {sorted({r.step for r in b})}", False
    return f"bit-identical: the first {steps} step(s) computed the same {len(a)} tensors in both runs", True


def check_determinism(config, algorithm: Any, *, reward: Any = None) -> str:
    """Run ``config.check_determinism`` steps twice (module docstring); returns the verdict."""
    from .trainer import Trainer

    steps = config.check_determinism
    root = Path(config.output_dir) / "determinism"
    folders = (root / "a", root / "b")
    log.info("check_determinism=%d: running the first %d step(s) twice, in %s", steps, steps, root)
    for folder in folders:
        if folder.exists():  # an earlier check's folders: this check's runs start afresh
            shutil.rmtree(folder)
        twin = config.model_copy(update={
            "output_dir": str(folder), "max_steps": steps, "record_hashes": True, "check_determinism": 0,
            "save_freq": 0, "eval_freq": 0, "trackers": (), "progress_bar": False, "resume": "never",
            "stop_at_val_score": None, "max_time_s": None, "trajectory_log_samples": 0})
        trainer = Trainer(twin, algorithm=algorithm)
        if reward is not None:
            trainer.set_reward_model(reward)
        try:
            trainer.train()
        finally:  # a twin on Ray gives its workers (and the Ray it started) back before the next one, and the run
            shutdown = getattr(trainer.executor, "shutdown", None)
            if shutdown is not None:
                shutdown()
    verdict, same = determinism_verdict(*folders, steps)
    (log.info if same else log.warning)("check_determinism: %s", verdict)
    try:
        (Path(config.output_dir) / "determinism.txt").write_text(verdict + "\n", encoding="utf-8")
    except OSError as err:
        raise WriteError("the determinism check's verdict cannot be written", err) from None
    if same:
        shutil.rmtree(root, ignore_errors=True)
    return verdict
