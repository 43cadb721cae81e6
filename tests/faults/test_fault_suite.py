"""The fault suite of issue 32: each case is a real fault (a process, a disk, a signal) and states three things:
the error is one of hybridflow's named errors (``hybridflow COMMAND: error: ...``, exit status 1), no traceback
reaches stderr, and nothing written before the fault is lost. See faultkit.py for how each fault is made.

Cases (the table in the hardening notes): read-only output folder (new run, resume), export into a read-only
folder, full disk while writing metrics and while writing a checkpoint, ``viz -o`` into a folder that cannot be
created, Ctrl-C during start-up (and landing inside a library's ``exec`` or thread start), an algorithm module with
a syntax error or that raises, GRPO with one sample per prompt, empty prompts, a reward function that never returns
(with a Ctrl-C while it hangs), an edited checkpoint state file, an unreadable metrics line on resume, a restart
rewinding metrics.jsonl, export into a non-empty folder.
"""
from __future__ import annotations

import json
import logging
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest
from faultkit import (REPO, assert_named_error, finish, metric_steps, readonly_prefix, restore_modes, run_overrides,
                      start)

from hybridflow.cli import main
from hybridflow.errors import DataError
from hybridflow.trainer.checkpoint import STATE_FILE, list_checkpoints

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals, rlimits and mounts")


def _readonly(folder: Path) -> list[str]:
    prefix, how = readonly_prefix(folder)
    if not how:
        pytest.skip("no way to make a folder read-only here (root without mount namespaces)")
    return prefix


# -- No raw traceback ---------------------------------------------------------------------------

def test_a_new_run_in_a_read_only_folder(tiny_model_dir, tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    try:
        proc = start(["run", *run_overrides(tiny_model_dir, folder / "run")], prefix=_readonly(folder))
        message = assert_named_error(*finish(proc)[::2], "run", "output_dir", str(folder / "run"), "Read-only file system"
                                     if proc.args[0] == "unshare" else "Permission denied")
    finally:
        restore_modes(folder)
    assert "hint:" in message and not (folder / "run").exists()


def test_a_resume_in_a_read_only_folder_keeps_the_run(finished_run, tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    try:
        proc = start(["run", *run_overrides(tiny_model_dir, run, max_steps=2, resume="auto")], prefix=_readonly(run))
        assert_named_error(*finish(proc)[::2], "run", "output_dir", ".hybridflow-run.lock")
    finally:
        restore_modes(run)
    assert {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_export_into_a_read_only_folder(finished_run, tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    try:
        proc = start(["export", str(finished_run), "--to", str(folder / "hf")], prefix=_readonly(folder))
        assert_named_error(*finish(proc)[::2], "export", "cannot write", str(folder / "hf"))
    finally:
        restore_modes(folder)


def test_a_full_disk_while_writing_metrics_keeps_every_whole_record(tiny_model_dir, tmp_path):
    """A 20 kB file-size limit: plan.json (17 kB) fits, metrics.jsonl (about 2.5 kB a step) fills up after some steps."""
    out = tmp_path / "run"
    proc = start(["run", *run_overrides(tiny_model_dir, out, max_steps=1000, save_freq=0)], file_size_limit=20_000)
    message = assert_named_error(*finish(proc)[::2], "run", "the metrics of step", "are kept", str(out / "metrics.jsonl"),
                                 "File too large")
    steps = metric_steps(out / "metrics.jsonl")  # whole lines only, each step once, none missing
    failed = int(message.split("the metrics of step ")[1].split()[0])
    assert steps == list(range(failed)) and failed > 1


def test_a_full_disk_while_writing_a_checkpoint_leaves_no_partial_one(tiny_model_dir, tmp_path):
    """A 1 MB file-size limit: the tiny model's shard (about 12 MB with Adam state) cannot be written."""
    out = tmp_path / "run"
    proc = start(["run", *run_overrides(tiny_model_dir, out, max_steps=2, save_freq=1)], file_size_limit=1_000_000)
    message = assert_named_error(*finish(proc)[::2], "run", "the checkpoint of step 1 cannot be written", "File too large")
    assert "unexpected pos" not in message
    assert list_checkpoints(out / "checkpoints") == [] and not list((out / "checkpoints").glob(".tmp-*"))
    assert metric_steps(out / "metrics.jsonl") == [0, 1]


def test_viz_into_a_folder_that_cannot_be_created(capsys):
    assert main(["viz", "grpo", "-o", "/proc/no-such-folder/graph.svg"]) == 1
    assert_named_error(1, capsys.readouterr().err, "viz", "the drawing", "/proc/no-such-folder")


def test_ctrl_c_during_start_up(tiny_model_dir, tmp_path):
    """SIGINT as the run starts (its first line is printed while it prepares): it stops then, in one line."""
    out = tmp_path / "run"
    proc = start(["run", *run_overrides(tiny_model_dir, out, max_steps=1000)])
    proc.stderr.readline()
    proc.send_signal(signal.SIGINT)
    status, _, stderr = finish(proc)
    assert "Traceback" not in stderr and status == 130, stderr[-3000:]
    assert stderr.strip().splitlines()[-1].startswith("hybridflow run: interrupted, stopped at once")
    assert not (out / "metrics.jsonl").exists()  # stopped before step 0, not after it


@pytest.mark.parametrize("module_source", [
    # dataclasses build methods with exec(): CPython marks an interrupt raised inside exec as unhandled, even
    # once caught, and a normal exit then ends the process by SIGINT (status -2), not with the 130 returned
    "exec('raise KeyboardInterrupt')\n",
    # a thread pool interrupted while starting a thread leaves one that interpreter shutdown joins for ever
    "import threading\nthreading.Thread(target=threading.Event().wait).start()\nraise KeyboardInterrupt\n",
], ids=["inside-exec", "thread-left-waiting"])
def test_a_ctrl_c_landing_inside_library_code_still_ends_the_command_with_130(tmp_path, module_source):
    """The two ways a start-up Ctrl-C (found by the test above, about 1 run in 40 beside a busy loop) broke a
    normal exit, made deterministic: the interrupt is raised where it once landed, in an imported module."""
    (tmp_path / "interrupted_algo.py").write_text(module_source)
    proc = start(["viz", "interrupted_algo:ppo", "-o", str(tmp_path / "g.svg")], cwd=tmp_path)
    status, _, stderr = finish(proc, timeout=60)
    assert "Traceback" not in stderr and status == 130, (status, stderr[-3000:])
    assert stderr.strip().splitlines()[-1] == "hybridflow viz: interrupted, stopped at once"


@pytest.mark.parametrize("source, phrases", [
    ("def f(:\n", ("syntax error", "line 1")),
    ("raise RuntimeError('no database here')\n", ("raised RuntimeError: no database here", "line 1")),
])
def test_an_algorithm_module_that_does_not_import(tmp_path, monkeypatch, capsys, source, phrases):
    (tmp_path / "broken_algo.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "broken_algo", raising=False)
    assert main(["viz", "broken_algo:ppo", "-o", str(tmp_path / "g.svg")]) == 1
    assert_named_error(1, capsys.readouterr().err, "viz", "broken_algo", *phrases)


# -- Nothing silent ------------------------------------------------------------------------------

def test_a_group_estimator_with_one_sample_per_prompt_is_refused(tiny_model_dir, tmp_path, capsys):
    assert main(["run", *run_overrides(tiny_model_dir, tmp_path / "run", algorithm="grpo", n_samples=1)]) == 1
    assert_named_error(1, capsys.readouterr().err, "run", "'grpo_advantage'", "1 response per prompt", "n_samples")


def test_empty_prompts_are_refused_or_skipped_with_a_count(tmp_path, caplog):
    from hybridflow.data import load_prompt_dataset

    rows = [{"prompt": p, "ground_truth": "1", "data_source": "t"} for p in ("1+0=", "  ", "0+1=", "")]
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=r"2 of 4 rows have an empty prompt \(row 2, 4\).*empty_prompts=skip"):
        load_prompt_dataset(path)
    with caplog.at_level(logging.WARNING, logger="hybridflow.data"):
        kept = load_prompt_dataset(path, empty_prompts="skip")
    assert [r["prompt"] for r in kept] == ["1+0=", "0+1="]
    assert "skipped 2 of 4 rows with an empty prompt" in caplog.text


def test_a_reward_that_never_returns_and_a_ctrl_c_while_it_hangs(tiny_model_dir, tmp_path):
    entered = tmp_path / "entered"
    (tmp_path / "hanging_reward.py").write_text(
        "import pathlib, threading\n\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        f"    pathlib.Path({str(entered)!r}).touch()\n    threading.Event().wait()\n")
    proc = start(["run", *run_overrides(tiny_model_dir, tmp_path / "run", reward_fn="hanging_reward:compute_score",
                                        reward_timeout_s=1, unfinished_score="null")], cwd=tmp_path)
    while not entered.exists():  # the reward function is running (and hangs)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)  # a first Ctrl-C waits for the step under way, which the timeout bounds
    stderr = finish(proc, timeout=120)[2]
    assert_named_error(proc.returncode, stderr, "run", "reward_timeout_s=1", "sample 0")
    assert "SIGINT received" in stderr


def test_an_edited_checkpoint_state_file_is_corrupt(finished_run, tmp_path, capsys):
    (_, checkpoint), = list_checkpoints(finished_run / "checkpoints")
    copy = tmp_path / checkpoint.name
    shutil.copytree(checkpoint, copy)
    state = json.loads((copy / STATE_FILE).read_text())
    state["step"] = 7  # everything else, the manifest included, unchanged
    (copy / STATE_FILE).write_text(json.dumps(state, indent=1))
    assert main(["export", str(copy), "--to", str(tmp_path / "hf")]) == 1
    assert_named_error(1, capsys.readouterr().err, "export", STATE_FILE, "does not match its state_sha256")
    assert main(["export", str(checkpoint), "--to", str(tmp_path / "hf")]) == 0  # the untouched one exports


def test_an_unreadable_metrics_line_on_resume_is_reported_and_kept(tmp_path, caplog):
    from hybridflow.trainer.metrics import JsonlTracker

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "a": 1.0}\n{"step": 1, "a": 2.0\n{"step": 2, "a": 3.0}\n{"step": 3, "a"')
    with caplog.at_level(logging.WARNING, logger="hybridflow.trainer"):
        JsonlTracker(path, resume_step=2).close()
    assert metric_steps(path) == [0, 2]
    assert "2 line(s) are not JSON records" in caplog.text and "line 2, 4" in caplog.text
    kept = (tmp_path / "metrics.unreadable.txt").read_text()
    assert 'metrics.jsonl:2: {"step": 1, "a": 2.0' in kept and 'metrics.jsonl:4: {"step": 3, "a"' in kept


def test_export_into_a_non_empty_folder_needs_overwrite(finished_run, tmp_path, capsys):
    target = tmp_path / "hf"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    assert main(["export", str(finished_run), "--to", str(target)]) == 1
    assert_named_error(1, capsys.readouterr().err, "export", "is not empty", "notes.txt", "--overwrite")
    assert main(["export", str(finished_run), "--to", str(target), "--overwrite"]) == 0
    assert (target / "notes.txt").read_text() == "mine" and (target / "config.json").is_file()


# -- Nothing lost ------------------------------------------------------------------------------------

def test_a_restart_rewinds_metrics_so_each_step_is_logged_once(tmp_path):
    """What the trainer does after a lost worker: back to the checkpoint's step, the later steps are run again."""
    from hybridflow.trainer.metrics import JsonlTracker

    tracker = JsonlTracker(tmp_path / "metrics.jsonl")
    for step in range(5):
        tracker.log({"a": float(step)}, step)
    tracker.rewind(2)  # the newest checkpoint is of step 2: steps 3 and 4 are run again
    for step in (3, 4):
        tracker.log({"a": 10.0 + step}, step)
    tracker.close()
    assert metric_steps(tmp_path / "metrics.jsonl") == [0, 1, 2, 3, 4]


def test_a_resumed_run_keeps_the_earlier_trace_and_timing_beside_its_own(finished_run, tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    earlier = {name: (run / name).read_bytes() for name in ("trace.json", "timing.txt")}
    assert main(["run", *run_overrides(tiny_model_dir, run, max_steps=2, save_freq=1, resume="auto")]) == 0
    assert (run / "trace.1.json").read_bytes() == earlier["trace.json"]
    assert (run / "timing.1.txt").read_bytes() == earlier["timing.txt"]
    assert (run / "trace.json").read_bytes() != earlier["trace.json"]
    assert metric_steps(run / "metrics.jsonl") == [0, 1, 2]


def test_overrides_after_an_option_are_overrides(tmp_path, capsys):
    """``run CONFIG --import MOD k=v``: the k=v are read as overrides (the value here is refused, naming the field)."""
    config = tmp_path / "run.yaml"
    config.write_text("max_steps: 1\n")
    assert main(["run", str(config), "--import", "json", "max_steps=-1"]) == 1
    assert_named_error(1, capsys.readouterr().err, "run", "max_steps")


def test_an_example_script_reports_a_read_only_folder_in_one_line(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    try:
        proc = start(["--steps", "1"], script=REPO / "examples" / "quickstart" / "minimal_ppo.py", cwd=tmp_path,
                     prefix=_readonly(runs))
        assert_named_error(*finish(proc)[::2], "minimal_ppo.py", "output_dir 'runs/minimal_ppo'", "cannot write")
    finally:
        restore_modes(runs)


def test_split_placement_says_why_it_does_not_apply(tmp_path, capsys):
    """GRPO with a rule reward has no device role besides actor and ref (the reward runs on the host): split has
    no second half. (``hybridflow run algorithm=grpo placement=split`` says the same, after loading the model.)"""
    assert main(["compile", "grpo", "--cluster", "h100-80g:1", "--model", "actor=llama2-7b", "reward=rule",
                 "--placement", "split", "-o", str(tmp_path / "plan.json")]) == 1
    assert_named_error(1, capsys.readouterr().err, "compile", "strategy 'split'", "['actor', 'ref']",
                       "one half would be empty", "'colocate' or 'auto'")
